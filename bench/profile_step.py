"""Where one grpokit step's seconds go: torch.profiler over measured steps of the bench workload.

    PYTHONPATH=src python bench/profile_step.py --model /tmp/grpokit-bench-models/qwen-h512-L8 --threads 2
    PYTHONPATH=src python bench/profile_step.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 \
        --G 16 --P 32 --T 512 --reward even_ids          # the GPU step of bench/gpu_bench.py

Prints the trainer's own phase timer (rollout, reward, update) per step, the phases bench/worker.py
measures, synchronised wall time of the rollout's parts (prefill, the static engine's decode steps,
sampling, recording the tokens) and the update's (reference logprobs, the policy's logprobs forward,
loss + backward, optimizer), and the profiler's top operators (by self CPU time, and on CUDA by self
device time) of two windows: the first measured step's update, and 8 decode steps (with their
sampling) a quarter into the last one's rollout.
``--model`` may name a shape of bench/workload.py (built under --models).
Read with bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker  # noqa: E402
from grpokit.rollout import static  # noqa: E402
from timing import sync  # noqa: E402
from workload import SHAPES, build_model_dir  # noqa: E402


class Spans:
    """Synchronised seconds per wrapped function, per step."""

    def __init__(self, device: str):
        self.device, self.s = device, {}

    def wrap(self, owner, name: str, label: str):
        inner = getattr(owner, name)

        def timed(*args, **kw):
            sync(self.device)
            t = time.perf_counter()
            with torch.profiler.record_function(label):
                out = inner(*args, **kw)
            sync(self.device)
            self.s[label] = self.s.get(label, 0.0) + time.perf_counter() - t
            return out

        setattr(owner, name, timed)

    def wrap_backward(self):
        inner = torch.Tensor.backward

        def timed(t, *args, **kw):
            sync(self.device)
            t0 = time.perf_counter()
            out = inner(t, *args, **kw)
            sync(self.device)
            self.s["backward"] = self.s.get("backward", 0.0) + time.perf_counter() - t0
            return out

        torch.Tensor.backward = timed


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help=f"a model folder, or a shape: {', '.join(SHAPES)}")
    p.add_argument("--models", default="/tmp/grpokit-gpu-models", help="where a --model shape is built")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--P", type=int, default=8)
    p.add_argument("--T", type=int, default=32)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reward", default="vowels", choices=sorted(worker.REWARDS))
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient (0: no reference pass, as latest.json)")
    p.add_argument("--no-profiler", action="store_true")
    p.add_argument(
        "--chat", action="store_true", help="chat prompts through the model's chat template (a real instruct model)"
    )
    p.add_argument("--set", action="append", default=[], help="grpokit config override KEY=VALUE (repeatable)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    model = a.model
    if model in SHAPES:
        model = str(build_model_dir(Path(a.models) / model, shape=model, device=a.device))
    wa = argparse.Namespace(
        model=model,
        G=a.G,
        P=a.P,
        T=a.T,
        steps=a.steps,
        warmup=1,
        beta=a.beta,
        lr=1e-5,
        device=a.device,
        dtype=a.dtype,
        seed=0,
        threads=a.threads,
        mbs=0,
        set=a.set,
        reward=a.reward,
        chat=a.chat,
    )
    clock = worker.PhaseClock()
    import grpokit.train.loop as gt
    import grpokit.train.update as gu
    from grpokit.rollout import hf
    from grpokit.train import reference
    from grpokit.train.memory import peak_allocated_bytes

    spans = Spans(a.device)
    spans.wrap(reference, "reference_logprobs", "ref_logprobs")
    spans.wrap(gu, "completion_logprobs", "policy_logprobs_fwd")
    spans.wrap(gu, "objective_loss", "loss_fn")
    spans.wrap(torch.optim.AdamW, "step", "optimizer_step")
    spans.wrap(torch.nn.utils, "clip_grad_norm_", "clip_grad_norm")
    spans.wrap_backward()
    # the rollout's parts: the decode loop already waits for the GPU every step (it reads the sampled
    # tokens), so synchronising around them moves little
    spans.wrap(hf, "_prefill", "rollout_prefill")
    spans.wrap(static.StaticDecoder, "step", "rollout_decode_step")
    spans.wrap(hf, "sample_tokens", "rollout_sample")
    spans.wrap(hf, "_record", "rollout_record")
    # run warm-up + measured steps through the worker's own grpokit runner, with two profiler windows,
    # each summarised and printed as it closes: the update of the first measured step, then a few decode
    # steps of the last step's rollout (a window over whole steps took minutes to summarise on a GPU:
    # every kernel of every CUDA graph replay is an event)
    orig_step, orig_scored = gt.Trainer.train_step, gt.Trainer._scored_batch
    windows = Windows(a.device, a.rows, enabled=not a.no_profiler)
    count = {"n": 0}
    decode_window(windows, lambda: count["n"] == 1 + a.steps, a.T)

    def scored(self):
        sb = orig_scored(self)
        windows.close()
        if count["n"] == 2:
            windows.open("update")
        return sb

    def step(self):
        count["n"] += 1
        spans.s = {}
        t = time.perf_counter()
        m = orig_step(self)
        windows.close()
        print(
            f"step {count['n']}: {time.perf_counter() - t:.3f}s  timer "
            + " ".join(f"{k}={v:.3f}" for k, v in m.items() if k.startswith("time/")),
            flush=True,
        )
        print("  parts (synchronised):", {k: round(v, 3) for k, v in spans.s.items()}, flush=True)
        if a.device.startswith("cuda"):
            print(
                f"  peak GPU memory {peak_allocated_bytes(a.device) / 2**30:.1f} GB; "
                f"micro-batch tokens {self.token_budget}",
                flush=True,
            )
        return m

    gt.Trainer.train_step, gt.Trainer._scored_batch = step, scored
    recs = worker.run_grpokit(wa, clock)
    for r in recs:
        print("worker phases:", {k: round(v, 3) for k, v in r["phases"].items()}, "step_s", round(r["step_s"], 3))


def decode_window(windows, active, T: int, steps: int = 8) -> None:
    """Profile ``steps`` decode steps (with the sampling between them) from a quarter of the way into
    each rollout for which ``active()`` holds; the static engine's steps are counted."""
    first = max(1, min(64, T // 4))
    last = min(first + steps, T - 1)
    inner = static.StaticDecoder.step
    state = {"i": 0, "decoder": None}

    def step(self, tok, pos):
        if self is not state["decoder"]:  # a new rollout (one decoder each)
            state["decoder"], state["i"] = self, 0
        state["i"] += 1
        if active() and state["i"] == first:
            windows.open(f"rollout, decode steps {first}-{last - 1} with their sampling")
        elif state["i"] == last:
            windows.close()
        return inner(self, tok, pos)

    static.StaticDecoder.step = step


class Windows:
    """One torch.profiler window at a time; closing one prints its top operators at once."""

    def __init__(self, device: str, rows: int, enabled: bool):
        self.device, self.rows, self.enabled, self.prof, self.label = device, rows, enabled, None, ""
        self.acts = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device.startswith("cuda") else []
        )

    def open(self, label: str) -> None:
        if self.enabled:
            sync(self.device)
            self.prof, self.label = torch.profiler.profile(activities=self.acts), label
            self.prof.__enter__()

    def close(self) -> None:
        if self.prof is None:
            return
        sync(self.device)
        t = time.perf_counter()
        self.prof.__exit__(None, None, None)
        avg = self.prof.key_averages()
        print(f"== profile of the {self.label} (summarised in {time.perf_counter() - t:.1f} s)", flush=True)
        print(avg.table(sort_by="self_cpu_time_total", row_limit=self.rows), flush=True)
        if self.device.startswith("cuda"):
            print(avg.table(sort_by="self_device_time_total", row_limit=self.rows), flush=True)
        self.prof = None


if __name__ == "__main__":
    main()
