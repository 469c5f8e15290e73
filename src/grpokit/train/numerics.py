"""What a run's floating-point sums depend on beyond its config: kept in each checkpoint, compared at resume.

On CPU a resumed run reproduces the uninterrupted one bit for bit (docs/FAULTS.md) when it computes with
the same kernels: the same torch, the same thread count and the same CPU instruction set (MKL and oneDNN
pick their kernels by it, and ``grpokit.nn.kernels`` picks oneDNN's row threshold and weight-gradient
kernel by it). A cluster job preempted on one node type and resumed on another continues the same
experiment, but its sums round differently from the first step on. Nothing would say so: the metrics
would simply part from a rerun's. So each checkpoint keeps ``numerics(model)`` in trainer_state.json and
a resume that computes differently says so once (``differences``), naming what changed.
"""

from __future__ import annotations

import torch

from grpokit.nn import kernels

# The CPU flags that choose kernels in MKL, oneDNN and grpokit.nn.kernels (their highest instruction sets).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def numerics(model: torch.nn.Module) -> dict[str, str | int]:
    """torch's version, the thread count, the device (and for a CPU its vendor and instruction sets), the
    float32 linears' kernels of ``model`` and the float32 matmul precision (with TF32's switches on a card)."""
    p = next(model.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    out: dict[str, str | int] = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if device.type == "cuda":
        out["device"] = torch.cuda.get_device_name(device)
    else:
        isa = [f for f in ISA_FLAGS if f in kernels.cpu_flags()]
        out["device"] = " ".join([device.type, kernels.cpu_vendor(), *isa]).strip()
    out["float32_linears"] = kernels.rule() if any(kernels.is_routed(m) for m in model.modules()) else "torch"
    # "high"/"medium" let float32 matmuls run in TF32 or bfloat16 (on a card, and on CPUs with AVX-512 BF16)
    out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    if device.type == "cuda":
        out["tf32"] = f"matmul {torch.backends.cuda.matmul.allow_tf32}, cudnn {torch.backends.cudnn.allow_tf32}"
    return out


def differences(saved: dict | None, now: dict) -> str | None:
    """One sentence on what computes differently now than when ``saved`` was written (None: nothing, or a
    checkpoint from before this record)."""
    if not saved:
        return None
    changed = [f"{k} {saved.get(k)!r} then, {now.get(k)!r} now" for k in sorted(now) if saved.get(k) != now.get(k)]
    if not changed:
        return None
    return (
        f"it was written by a process that computed differently ({'; '.join(changed)}), so the resumed run "
        "continues the same experiment but its sums round differently: it will not match the uninterrupted "
        "run bit for bit"
    )
