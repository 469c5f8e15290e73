"""float32 ``nn.Linear`` on CPU through oneDNN instead of the BLAS that ``F.linear`` calls.

Why: PyTorch's CPU wheels run float32 ``F.linear``/``mm`` through Intel MKL, which on AMD
processors takes a slower code path. oneDNN (bundled in the same wheel, as ``mkldnn``) picks its
kernels from the CPU's instruction set. On the 2-core AMD EPYC of round 3 (AVX2), a forward matmul of
a training batch ran at ~195 GFLOP/s through oneDNN against ~140 through MKL; on a 2-core Zen 5 EPYC
(AVX-512), 370-450 against 210-220 (bench/RESULTS.md).

What changes: every plain float32 ``nn.Linear`` of the model computes ``y = x W^T + b`` and, in the
backward pass, ``dx = dy W`` with oneDNN when the input has at least ``MIN_ROWS`` rows. On an AVX2
CPU that is 128 rows (fewer, as in a prefill or a decode step of the dynamic-cache engine, keep
``F.linear``) and ``dW = dy^T x`` stays on torch's ``mm``. With AVX-512 it is 16 rows and ``dW`` is
oneDNN's too, a linear over the transposed gradient (copied contiguous by the op) and the transposed
input: on the Zen 5 oneDNN ran 1.6-2.2x MKL from 16 rows up, weight gradients included
(bench/RESULTS.md, 2026-11-30). Same math; the summation order differs, so results agree with
``F.linear`` to float32 rounding (relative ~1e-6), not bit for bit. Layers that are not plain
float32 CPU tensors at call time (GPU, autocast, half precision, FSDP-sharded or quantised weights)
call ``F.linear``.

Decode steps (``rollout/static.py``) use oneDNN differently: their weights are fixed for the whole
rollout, so ``fused_linear`` reorders them once into oneDNN's blocked layout (and joins linears that
read the same input, q/k/v and gate/up, into one matmul). Reordering per call is what made plain
oneDNN no faster than MKL for a decode step's few rows; with the weights reordered, one matmul of
1-16 rows runs 1.4-3.7x faster than ``F.linear`` (bench/RESULTS.md, round 4).

The decode step's RMSNorms are one ``torch.rms_norm`` call each where that equals the model's module
bit for bit (``rms_norm_of``): fewer operator calls on a step's few rows, on any device.

``cpu_matmul="auto"`` uses oneDNN on x86 CPUs that are not Intel's (where MKL's dispatch is the
problem) and leaves Intel and Arm CPUs to ``F.linear``. It is a fixed rule, not a timing probe, so
every process of a run, and a resumed one on the same CPU type, computes with the same kernels (a
resume on another type is warned about: train/numerics.py).
"""

from __future__ import annotations

import functools
import platform
import types

import torch
import torch.nn.functional as F

from grpokit.config.sections import ConfigError

MODES = ("auto", "onednn", "torch")


def onednn_available() -> bool:
    """True when this torch build has oneDNN's dense linear op for CPU tensors."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        _onednn(torch.ones(2, 3), torch.ones(4, 3), None)
    except (RuntimeError, AttributeError):
        return False
    return True


def _onednn(x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x2d @ weight.T + bias`` by oneDNN; ``weight`` may be a strided view (e.g. a transpose)."""
    return torch.ops.mkldnn._linear_pointwise(x2d, weight, bias, "none", [], "")


def _cpuinfo(field: str, path: str = "/proc/cpuinfo") -> str:
    """The first ``field`` line's value in /proc/cpuinfo on x86, or ""."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=1)
def cpu_vendor() -> str:
    """The x86 vendor string ("AuthenticAMD", "GenuineIntel", ...) from /proc/cpuinfo, or ""."""
    return _cpuinfo("vendor_id")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The x86 CPU's flags from /proc/cpuinfo (``avx2``, ``avx512f``, ...), or none."""
    return frozenset(_cpuinfo("flags").split())


def wants_onednn(mode: str, device: torch.device) -> bool:
    """Resolve ``model.cpu_matmul`` for a model on ``device``."""
    if mode not in MODES:
        raise ValueError(f"cpu_matmul must be one of {', '.join(MODES)}, got {mode!r}")
    if device.type != "cpu" or mode == "torch":
        return False
    if mode == "onednn":
        if not onednn_available():
            raise ConfigError(
                "model.cpu_matmul='onednn' but this torch build has no oneDNN linear op; use 'auto' or 'torch'"
            )
        return True
    # MKL, behind F.linear, dispatches non-Intel x86 CPUs to slower kernels; oneDNN does not. A
    # fixed rule rather than a timing probe, so a resumed run on the same CPU type picks the same kernels.
    return cpu_vendor() not in ("", "GenuineIntel") and onednn_available()


class _OneDNNLinear(torch.autograd.Function):
    """``y = x W^T + b`` with oneDNN forward and input-gradient matmuls (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        x2d = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2d, weight)
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        return _onednn(x2d, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x2d, weight = ctx.saved_tensors
        dy2d = dy.reshape(-1, dy.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _onednn(dy2d, weight.t(), None).view(ctx.x_shape)  # dy @ W
        if ctx.needs_input_grad[1]:
            dw = _onednn(dy2d.t(), x2d.t(), None) if WEIGHT_GRAD_ONEDNN else dy2d.t() @ x2d  # dy^T @ x
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2d.sum(0)
        return dx, dw, db


def _plain_fp32_cpu(t: torch.Tensor | None) -> bool:
    return t is None or (
        type(t) in (torch.Tensor, torch.nn.Parameter) and t.dtype == torch.float32 and t.device.type == "cpu"
    )


# Below this many rows oneDNN over a plain weight gains nothing measurable on an AVX2 CPU (Zen 3): it
# reorders the weight into its blocked layout on every call, which at few rows costs about as much as
# the matmul (the static decode step reorders once per rollout instead: fused_linear). With AVX-512
# (a Zen 5 EPYC, bench/RESULTS.md 2026-11-30) oneDNN ran 1.6-2.2x MKL's speed from 16 rows up (a
# prompt-sharing forward of two prompts, a few-row decode step) and up to 2x at every training shape.
# The weight gradient's long reduction over the rows: oneDNN's with AVX-512 (measured 1.7-2x MKL's on
# Zen 5), torch's ``mm`` on AVX2 CPUs, where it was kept for being as fast. A fixed rule from the CPU's
# flags, not a timing probe: a resume on the same CPU type picks the same kernels.


def rule_for(flags: frozenset[str]) -> tuple[int, bool]:
    """``(MIN_ROWS, WEIGHT_GRAD_ONEDNN)`` for a CPU with these /proc/cpuinfo flags."""
    return (16, True) if "avx512f" in flags else (128, False)


MIN_ROWS, WEIGHT_GRAD_ONEDNN = rule_for(cpu_flags())


def _linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # type check: FSDP2 re-classes the modules it shards (FSDPLinear) and hooks their outputs
    routed = (
        type(self) is torch.nn.Linear
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and _plain_fp32_cpu(self.weight)
        and _plain_fp32_cpu(self.bias)
        and not torch.is_autocast_enabled("cpu")
        and x.numel() >= MIN_ROWS * x.shape[-1]
    )
    if routed:  # without gradients (no_grad, frozen inputs) autograd records nothing for it
        return _OneDNNLinear.apply(x, self.weight, self.bias)
    return F.linear(x, self.weight, self.bias)


def rule() -> str:
    """The kernels a routed linear computes with on this CPU, in words (kept in checkpoints: train/numerics.py)."""
    dw = "oneDNN" if WEIGHT_GRAD_ONEDNN else "torch.mm"
    return f"oneDNN from {MIN_ROWS} rows, weight gradients on {dw}"


def is_routed(module: torch.nn.Module) -> bool:
    """True when ``module`` is a plain ``nn.Linear`` that ``use_onednn_linears`` routed to oneDNN."""
    return type(module) is torch.nn.Linear and getattr(module.forward, "__func__", None) is _linear_forward


def fused_linear(modules: list[torch.nn.Module]):
    """One oneDNN matmul for linears that read the same input, with the weights reordered once.

    For inference over a fixed snapshot of the weights (a rollout's decode steps). Returns
    ``x -> the modules' outputs side by side`` (one tensor, last dim the sum of their widths), or
    None when any module is not a routed plain float32 CPU ``nn.Linear`` (LoRA, quantised, GPU,
    FSDP-sharded, oneDNN off) or autocast is on: the caller then calls the modules themselves. The
    reordered copy lives as long as the returned function.
    """
    if (
        not modules
        or torch.is_autocast_enabled("cpu")
        or not all(is_routed(m) and _plain_fp32_cpu(m.weight) and _plain_fp32_cpu(m.bias) for m in modules)
    ):
        return None
    weight = torch.cat([m.weight.detach() for m in modules])
    if any(m.bias is not None for m in modules):
        bias = torch.cat([m.bias.detach() if m.bias is not None else weight.new_zeros(m.out_features) for m in modules])
    else:
        bias = None
    packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    total = weight.shape[0]
    del weight  # only the reordered copy is kept

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or torch.is_autocast_enabled(
            "cpu"
        ):  # entered autocast since: the modules' own path
            return torch.cat([m(x) for m in modules], dim=-1)
        return _onednn(x.reshape(-1, x.shape[-1]), packed, bias).view(*x.shape[:-1], total)

    return run


def use_onednn_linears(model: torch.nn.Module) -> int:
    """Route every exact ``nn.Linear`` of ``model`` through oneDNN (idempotent); returns how many.

    Subclasses of ``nn.Linear`` (LoRA layers, quantised linears) keep their own forward; the plain
    ``nn.Linear`` inside them is routed. The binding is per instance, so ``copy.deepcopy`` carries it."""
    n = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.forward = types.MethodType(_linear_forward, module)
            n += 1
    return n


# The families' RMSNorm modules: x.float() * rsqrt(mean(x^2) + eps), cast back, times the weight.
RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm", "Qwen2VLRMSNorm", "Qwen2_5_VLRMSNorm")


def rms_norm_of(module):
    """``x -> module(x)`` for a decode step: torch's ``rms_norm`` (one operator call where the module
    makes seven, each a few microseconds on a CPU decode step's few rows) where that gives the module's
    float32 values bit for bit, checked here on a fixed input (torch's rms_norm runs the same operations
    in the same order: tests/rollout/test_static_step.py); the module itself otherwise (other dtypes,
    which the module casts through float32; autocast; other norms, such as liger's kernels)."""
    weight, eps = getattr(module, "weight", None), getattr(module, "variance_epsilon", None)
    if (
        type(module).__name__ not in RMS_NORMS
        or not isinstance(eps, float)
        or not isinstance(weight, torch.Tensor)
        or weight.dtype != torch.float32
        or weight.dim() != 1
    ):
        return module
    shape = (weight.shape[0],)
    probe = torch.linspace(-4.0, 3.0, 3 * shape[0], device=weight.device).view(3, -1) ** 3
    with torch.no_grad():
        if not torch.equal(torch.rms_norm(probe, shape, weight, eps), module(probe)):
            return module

    def fused(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or torch.is_autocast_enabled(x.device.type):
            return module(x)
        return torch.rms_norm(x, shape, weight, eps)

    return fused
