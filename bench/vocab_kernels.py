"""nn/vocab.py's Triton kernels against the torch code they replace, at a real vocabulary's size.

Two measurements, each as the step runs it, with CUDA events (median of --reps after --warmup):

- sampling: one decode step's draw from (--rows, --vocab) logits at temperature --temperature
  (rollout/sampling.py ``sample_tokens`` with and without the kernel);
- head: the update's output layer, forward and backward of train/head.py's function over --positions
  positions of hidden size --hidden (torch's passes, then the kernels), with the peak memory above
  what the inputs hold.

    python bench/vocab_kernels.py --json bench/gpu/vocab.json        # on a card (bench/gpu.sh vocab)
    python bench/vocab_kernels.py --tiny                            # CPU, Triton's interpreter: the harness only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_ms  # noqa: E402  (imports no torch: --tiny sets the interpreter in time)


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=512, help="decode rows (P x G)")
    p.add_argument("--vocab", type=int, default=151936, help="vocabulary size (Qwen2.5's)")
    p.add_argument("--positions", type=int, default=4096, help="positions in one head chunk")
    p.add_argument("--hidden", type=int, default=896, help="hidden size (Qwen2.5-0.5B's)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--tiny", action="store_true", help="CPU under Triton's interpreter, small shapes")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = _args(argv)
    if a.tiny:  # before triton is imported: its library functions are wrapped at import
        os.environ["TRITON_INTERPRET"] = "1"
        a.rows, a.vocab, a.positions, a.hidden, a.reps, a.warmup = 4, 96, 8, 16, 2, 1
    import torch

    from grpokit.nn import vocab

    device = torch.device("cpu" if a.tiny else "cuda")
    dtype = torch.float32 if a.tiny else torch.bfloat16
    if not vocab.usable_for(dtype, device):
        print("vocab_kernels: Triton cannot run here (needs CUDA and triton)")
        return 1
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)", **vars(a)}
    out["sampling"] = _sampling(a, device, dtype)
    out["head"] = _head(a, device, dtype)
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def _timed(fn, a, device) -> float:
    """Median milliseconds of ``fn()``, the device synchronised before and after each call."""
    return median_ms(fn, a.warmup, a.reps, device.type)


def _sampling(a, device, dtype) -> dict:
    import torch

    from grpokit.rollout.sampling import SamplingParams, sample_tokens

    logits = torch.randn(a.rows, a.vocab, device=device).mul_(3).to(dtype)
    params = SamplingParams(temperature=a.temperature)
    gen = torch.Generator(device=device).manual_seed(0)
    res = {}
    for name, on in (("torch_ms", False), ("triton_ms", True)):
        res[name] = _timed(lambda: sample_tokens(logits, params, gen, on), a, device)
    # the kernel's log-probabilities against log_softmax of the tokens it drew
    tok, logp = sample_tokens(logits, params, gen, True)
    ref = torch.log_softmax(logits.float() / a.temperature, -1).gather(1, tok[:, None])[:, 0]
    res["max_abs_logp_diff"] = (logp - ref).abs().max().item()
    res["speedup"] = res["torch_ms"] / res["triton_ms"]
    return res


def _head(a, device, dtype) -> dict:

    import grpokit.train.head as H
    from grpokit.nn import vocab

    kept, H.FUSED_DEVICES = H.FUSED_DEVICES, (device.type,)  # the CPU (--tiny) takes the fused path too
    try:
        return _head_sides(a, device, dtype, H, vocab)
    finally:
        H.FUSED_DEVICES = kept


def _head_sides(a, device, dtype, H, vocab) -> dict:
    import torch

    g = torch.Generator(device=device).manual_seed(1)
    head = torch.nn.Linear(a.hidden, a.vocab, bias=False, device=device, dtype=dtype)
    h = torch.randn(a.positions, a.hidden, device=device, dtype=dtype, generator=g).requires_grad_()
    t = torch.randint(0, a.vocab, (a.positions,), device=device, generator=g)
    up = torch.randn(a.positions, device=device, generator=g)
    res, grads = {}, {}
    for name, on in (("torch", False), ("triton", True)):
        setattr(head, vocab.MARK, on)

        def step():
            h.grad, head.weight.grad = None, None
            lp, _ = H.head_logprobs(head, h, t, a.positions, 1.0, False)
            (lp * up).sum().backward()

        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        res[f"{name}_ms"] = _timed(step, a, device)
        if device.type == "cuda":
            res[f"{name}_peak_extra_gb"] = (torch.cuda.max_memory_allocated() - base) / 1e9
        grads[name] = h.grad.float()
    res["max_rel_grad_diff"] = ((grads["triton"] - grads["torch"]).abs().max() / grads["torch"].abs().max()).item()
    res["speedup"] = res["torch_ms"] / res["triton_ms"]
    return res


if __name__ == "__main__":
    sys.exit(main())
