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
    """torch's version, the device (for a CPU its vendor, instruction sets and torch's thread count), the float32
    linears' kernels of ``model`` and the float32 matmul precision of the device's backends."""
    p = next(model.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    out: dict[str, str | int] = {"torch": torch.__version__}
    if device.type == "cuda":  # a card's sums do not depend on the host's threads
        out["device"] = torch.cuda.get_device_name(device)
    else:
        isa = [f for f in ISA_FLAGS if f in kernels.cpu_flags()]
        out["device"] = " ".join([device.type, kernels.cpu_vendor(), *isa]).strip()
        out["threads"] = torch.get_num_threads()
    out["float32_linears"] = kernels.rule() if any(kernels.is_routed(m) for m in model.modules()) else "torch"
    out["float32_matmul_precision"] = matmul_precision(device)
    return out


def matmul_precision(device: torch.device) -> str:
    """The float32 matmul precision on ``device``'s backends ("ieee", "tf32", "bf16": TF32 or bfloat16 sums on a
    card, bfloat16 on CPUs with AVX-512 BF16). Read per backend: torch's global getter raises once the legacy
    switches (``allow_tf32``, which grpokit.trl sets for TRL's ``tf32``) and the new API were both used."""
    backends = (
        ("cuda matmul", torch.backends.cuda.matmul, "allow_tf32"),
        ("cudnn", torch.backends.cudnn, "allow_tf32"),
    )
    if device.type != "cuda":
        backends = (("matmul", torch.backends.mkldnn.matmul, None),) if hasattr(torch.backends.mkldnn, "matmul") else ()
    parts = []
    for name, backend, legacy in backends:
        value = getattr(backend, "fp32_precision", None)
        if value is None and legacy is not None:  # a torch before the per-backend API
            value = "tf32" if getattr(backend, legacy) else "ieee"
        parts.append(f"{name} {value}")
    return ", ".join(parts) or "default"


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
