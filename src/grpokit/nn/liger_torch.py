"""liger-kernel's layers in torch's ops, for a policy that holds them on a device without CUDA.

liger-kernel (train/liger.py, ``model.kernels``) patches transformers' module-level classes of a model family
as well as the policy it is given, so a model of that family built later in the same process is made of
liger's own classes (``LigerRMSNorm``, ``LigerSwiGLUMLP``), whose forwards are Triton GPU kernels: on a CPU
they fail with Triton's "cannot be accessed from Triton (cpu tensor?)". That happens to a rollout worker on
the CPU beside a trainer on a card (``rollout.async_worker_device=cpu``: its copy is unpickled as liger's
classes where the policy was built after the patch) and to a CPU run after a card run in one process
(a notebook). ``to_torch`` gives such layers a class of their own that computes the same values with
torch's ops; any other liger class is refused in one sentence (it would fail at its first call).

The math follows liger's RMSNorm casting modes (its ``casting_mode``): "llama" normalises in float32 and
casts back before the weight, "gemma" also multiplies in float32, "none" computes in the input's dtype;
``offset`` is added to the weight (Gemma's ``1 + w``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpokit.config.sections import ConfigError


class TorchRMSNorm(torch.nn.Module):
    """A ``LigerRMSNorm`` (any of its subclasses) computed with torch's ops; the same attributes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mode, dtype = getattr(self, "casting_mode", "llama"), x.dtype
        h = x if mode == "none" else x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        weight = getattr(self, "weight", None)
        if weight is None:  # a scale-free norm (liger's with_scale=False)
            return h.to(dtype)
        scale = getattr(self, "offset", 0.0) + weight
        if mode == "llama":
            return h.to(dtype) * scale
        return (h * scale.to(h.dtype)).to(dtype)


class TorchSwiGLUMLP(torch.nn.Module):
    """A ``LigerSwiGLUMLP`` computed with torch's ops: ``down(silu(gate(x)) * up(x))``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _torch_class(module: torch.nn.Module) -> type | None:
    names = {c.__name__ for c in type(module).__mro__}
    if "LigerRMSNorm" in names:
        return TorchRMSNorm
    if "LigerSwiGLUMLP" in names:
        return TorchSwiGLUMLP
    return None


def liger_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model`` whose class is liger-kernel's own."""
    return [m for m in model.modules() if type(m).__module__.startswith("liger_kernel.")]


def untranslatable(model: torch.nn.Module) -> str | None:
    """The name of a liger-kernel class in ``model`` that ``to_torch`` has no torch version of, or None."""
    return next((type(m).__name__ for m in liger_layers(model) if _torch_class(m) is None), None)


def refuse_untranslatable(model: torch.nn.Module, where: str) -> None:
    """Refuse, in one sentence, a policy holding a liger-kernel class with no torch version, bound for ``where``."""
    name = untranslatable(model)
    if name is not None:
        raise ConfigError(
            f"the policy holds liger-kernel's {name} layers (transformers' classes patched by model.kernels on a "
            f"card earlier in this process), which run on CUDA only, and {where} has none: start the run in a fresh "
            "process"
        )


def to_torch(model: torch.nn.Module, where: str) -> int:
    """Give every liger-kernel RMSNorm and SwiGLU layer of ``model`` its torch class (in place; the parameters
    and attributes stay); returns how many. Refuses any other liger class (``where``: the device, for the
    message)."""
    refuse_untranslatable(model, where)
    layers = liger_layers(model)
    for m in layers:
        m.__class__ = _torch_class(m)
    return len(layers)
