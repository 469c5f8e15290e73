"""One side of the comparison in its own process, so its peak RSS is its own.

    python bench/worker.py --side grpokit|trl --model DIR --G 8 --P 8 --T 32 --steps 3 --warmup 1

Prints one JSON line: per measured step its wall time and phases (rollout, ref forward, policy
backbone forward, the rest = loss + backward + optimizer; an asynchronous side's wait for its prefetched batch
is ``rollout_wait``, and its sampler thread's decode speed ``sampler_tok_s``), generated tokens, useful FLOPs,
and the process's peak RSS. Phases come from forward hooks on the *backbones* of the policy and the
reference (both trainers call them), and from wrapping the rollout call, so the split is measured
the same way on both sides.
"""

from __future__ import annotations

import argparse
import atexit
import json
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import sync  # noqa: E402
from workload import chat_prompts, model_flops, prompts, reward_even_ids, reward_vowels  # noqa: E402

REWARDS = {"vowels": reward_vowels, "even_ids": reward_even_ids}


class PhaseClock:
    """Accumulates seconds per phase name; ``hook(module, name, cond)`` times a module's forwards."""

    def __init__(self):
        self.spans: dict[str, float] = {}
        self.lengths: list[tuple[int, int]] = []  # (prompt_len, completion_len) of each rollout row
        self.background: list[tuple[float, int]] = []  # (seconds, tokens) of the async sampler thread's generate calls

    def add(self, name, dt):
        self.spans[name] = self.spans.get(name, 0.0) + dt

    def hook(self, module, name, cond=lambda m: True):
        starts = []
        module.register_forward_pre_hook(lambda m, a: starts.append(time.perf_counter()) if cond(m) else None)

        def post(m, a, o):
            if starts and cond(m):
                self.add(name, time.perf_counter() - starts.pop())

        module.register_forward_hook(post)

    def reset(self):
        self.spans, self.lengths, self.background = {}, [], []


def _scratch(prefix: str) -> str:
    """A temporary run folder, removed when this worker exits (one was left in /tmp per run before)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def run_grpokit(a, clock: PhaseClock) -> list[dict]:
    import grpokit.rollout.engine as ge  # the hf engine's module: its generate is the one a step calls
    import grpokit.train.loop as gt
    from grpokit.config import Config
    from grpokit.config.io import apply_overrides

    cfg = Config()
    cfg.model.name_or_path, cfg.model.device, cfg.model.dtype = a.model, a.device, a.dtype
    cfg.data.task, cfg.data.chat_template = (
        "",
        "conversational",
    )  # chat rows templated (as TRL does), text rows as written
    cfg.rollout.group_size, cfg.rollout.max_new_tokens = a.G, a.T
    cfg.algo.beta, cfg.algo.aggregation = a.beta, "seq-mean-token-mean"
    cfg.optim.lr = a.lr
    cfg.train.prompts_per_step, cfg.train.steps, cfg.train.seed = a.P, a.warmup + a.steps, a.seed
    cfg.train.micro_batch_size = a.mbs  # 0: the whole batch in one forward/backward (default)
    cfg.train.threads = a.threads  # grpokit's own default is 1 thread: without this, --threads 2 ran ours on 1
    cfg.train.out = _scratch("grpokit-bench-")
    cfg.record.sinks, cfg.record.report = [], False
    cfg = apply_overrides(cfg, a.set)  # e.g. model.cpu_matmul=torch for a "without oneDNN" column
    tr = gt.Trainer(cfg, reward_funcs=[REWARDS[a.reward]], train_rows=_rows(a), eval_rows=[], quiet=True)
    progress("grpokit: trainer ready")
    inner = ge.generate

    def timed_generate(model, prompt_ids, G, *args, **kw):
        t = time.perf_counter()
        ro = inner(model, prompt_ids, G, *args, **kw)
        sync(a.device)
        if threading.current_thread() is not threading.main_thread():  # the async sampler thread: no phase of the
            clock.background.append((time.perf_counter() - t, sum(map(len, ro.completion_ids))))  # step's own
            return ro
        clock.add("rollout", time.perf_counter() - t)
        clock.lengths += [(len(ro.prompt_ids[i // G]), len(c)) for i, c in enumerate(ro.completion_ids)]
        return ro

    ge.generate = timed_generate
    _time_prefetch(tr.engine, clock, a)
    _hook_backbones(clock, tr.model, tr.ref_model)
    out = []
    for step in range(a.warmup + a.steps):
        clock.reset()
        t = time.perf_counter()
        m = tr.train_step()
        sync(a.device)
        dt = time.perf_counter() - t
        FIRST.setdefault("first_step_s", dt)
        progress(f"grpokit: step {step + 1} took {dt:.2f} s (rollout {clock.spans.get('rollout', 0.0):.2f} s)")
        if step >= a.warmup:  # the sampler/trainer mismatch and memory grpokit measured itself
            out.append(
                {
                    **_step_record(dt, clock, tr.model.config, a),
                    "metrics": {k: v for k, v in m.items() if k.startswith(("mismatch/", "gpu/"))},
                }
            )
        tr.step += 1
    return out


def _time_prefetch(engine, clock: PhaseClock, a) -> None:
    """An asynchronous sampler (rollout.async_staleness > 0) samples a step's batch outside the step: the step's
    wait for it is its "rollout_wait" phase, and the batch's lengths count as the step's tokens and FLOPs."""
    inner = getattr(engine, "prefetched", None)
    if inner is None:
        return

    def timed_prefetched(n, group_size):
        t = time.perf_counter()
        got = inner(n, group_size)
        if got is not None:
            clock.add("rollout_wait", time.perf_counter() - t)
            ro = got[1]
            clock.lengths += [(len(ro.prompt_ids[i // a.G]), len(c)) for i, c in enumerate(ro.completion_ids)]
        return got

    engine.prefetched = timed_prefetched


def run_trl(a, clock: PhaseClock) -> list[dict]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from trl import GRPOConfig, GRPOTrainer

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.dtype]
    extra, peft = {}, {}
    if a.qlora:  # the same 4-bit NF4 base as grpokit's model.quantization=nf4
        from transformers import BitsAndBytesConfig

        extra["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=True
        )
    if a.lora:
        from peft import LoraConfig

        peft["peft_config"] = LoraConfig(
            r=a.lora, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
        )
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, **extra)
    tok = AutoTokenizer.from_pretrained(a.model)
    progress("trl: model loaded")
    N = a.P * a.G
    args = GRPOConfig(
        output_dir=_scratch("trl-bench-"),
        per_device_train_batch_size=a.trl_mbs or N,
        num_generations=a.G,
        max_completion_length=a.T,
        beta=a.beta,
        learning_rate=a.lr,
        loss_type="grpo",
        max_steps=a.warmup + a.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=a.device == "cpu",
        bf16=a.dtype == "bfloat16",
        seed=a.seed,
        temperature=1.0,
        gradient_accumulation_steps=N // (a.trl_mbs or N),
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        **{k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in a.set)},
    )  # e.g. gradient_checkpointing=false
    steps: list[dict] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            clock.reset()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            sync(a.device)
            dt = time.perf_counter() - self.t
            FIRST.setdefault("first_step_s", dt)
            progress(f"trl: step {state.global_step} took {dt:.2f} s (rollout {clock.spans.get('rollout', 0.0):.2f} s)")
            if state.global_step > a.warmup:
                steps.append(_step_record(dt, clock, trainer.model.config, a))

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[REWARDS[a.reward]],
        args=args,
        train_dataset=Dataset.from_list(_rows(a)),
        processing_class=tok,
        callbacks=[StepClock()],
        **peft,
    )
    inner = trainer.model.generate

    def timed_generate(*args, **kw):
        t = time.perf_counter()
        out = inner(*args, **kw)
        sync(a.device)
        clock.add("rollout", time.perf_counter() - t)
        plen = kw["input_ids"].shape[1]
        mask = kw.get("attention_mask")
        for i, row in enumerate(out[:, plen:].tolist()):
            n = next((k + 1 for k, x in enumerate(row) if x == tok.eos_token_id), len(row))
            clock.lengths.append((int(mask[i].sum()) if mask is not None else plen, n))
        return out

    trainer.model.generate = timed_generate
    _hook_backbones(clock, trainer.model, trainer.ref_model)
    trainer.train()
    return steps


def _rows(a) -> list[dict]:
    """The workload's prompts: chat messages for ``--chat`` (a real instruct model), else short text."""
    return chat_prompts() if getattr(a, "chat", False) else prompts()


T0 = time.perf_counter()


def progress(what: str) -> None:
    """One line on stderr as the side goes, with seconds since the worker started: a caller that cuts
    the worker off at its time limit still learns where the time went."""
    print(f"worker {time.perf_counter() - T0:7.1f} s: {what}", file=sys.stderr, flush=True)


FIRST: dict[str, float] = {}  # the first (warm-up) step's wall time: compile, graph capture, allocator growth


def _hook_backbones(clock, policy, ref):
    """Time the decoder stacks (``get_decoder()``, through a PEFT wrapper too: the module grpokit's
    log-probability passes call directly)."""
    clock.hook(policy.get_decoder(), "policy_fwd", lambda m: torch.is_grad_enabled() and m.training)
    if ref is not None:
        clock.hook(ref.get_decoder(), "ref_fwd")


def _step_record(dt, clock, cfg, a) -> dict:
    fl = {"rollout": 0.0, "ref": 0.0, "train": 0.0}
    P = len(clock.lengths) // a.G
    for i, (lp, lc) in enumerate(clock.lengths):
        f = model_flops(cfg, lp, lc)
        # the useful work: a group's prompt once (its G completions share it), then each completion after it;
        # a trainer that runs the prompt once per completion (TRL) does more work than this, not more useful work
        useful = f["decode"] + (f["prefill"] if i % a.G == 0 else 0.0)
        fl["rollout"] += useful
        fl["ref"] += useful if a.beta > 0 else 0.0
        fl["train"] += 3 * useful  # forward + backward (2x)
    spans = dict(clock.spans)
    spans["update_rest"] = dt - sum(spans.values())
    bg_s, bg_tokens = sum(s for s, _ in clock.background), sum(n for _, n in clock.background)
    return {
        "step_s": dt,
        "phases": spans,
        "gen_tokens": sum(lc for _, lc in clock.lengths),
        "prompts": P,
        "flops": fl,
        "sampler_tok_s": bg_tokens / bg_s if bg_s else None,  # the async sampler thread's decode, in the background
    }


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--side", choices=["grpokit", "trl"], required=True)
    p.add_argument("--model", required=True)
    for name, default in (
        ("G", 8),
        ("P", 8),
        ("T", 32),
        ("steps", 3),
        ("warmup", 1),
        ("seed", 0),
        ("threads", 0),
        ("mbs", 0),
        ("trl-mbs", 0),
        ("lora", 0),
    ):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reward", default="vowels", choices=sorted(REWARDS))
    p.add_argument(
        "--chat", action="store_true", help="chat prompts through the model's chat template (a real instruct model)"
    )
    p.add_argument(
        "--qlora", action="store_true", help="TRL side: 4-bit NF4 base (grpokit side: --set model.quantization=4bit)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        help="override KEY=VALUE (repeatable): a grpokit config field, or a GRPOConfig field for --side trl",
    )
    a = p.parse_args(argv)
    from grpokit.train.memory import peak_allocated_bytes

    if a.threads:
        torch.set_num_threads(a.threads)
    clock = PhaseClock()
    t0 = time.perf_counter()
    steps = (run_grpokit if a.side == "grpokit" else run_trl)(a, clock)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # grpokit resets the allocator's peak at every phase (its gpu/<phase>/memory_peak_gb metrics), so
    # torch.cuda.max_memory_allocated() alone would cover only the last phase
    gpu_mb = peak_allocated_bytes(a.device) / 2**20 if a.device.startswith("cuda") else 0.0
    print(
        "BENCH_JSON "
        + json.dumps(
            {
                "side": a.side,
                "steps": steps,
                "peak_rss_mb": rss_mb,
                "peak_gpu_mb": gpu_mb,
                **FIRST,
                "wall_s": time.perf_counter() - t0,
                "threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
