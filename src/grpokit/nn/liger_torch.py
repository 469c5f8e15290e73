"""liger-kernel's layers in torch's ops, for a policy that holds them on a device without CUDA.

liger-kernel (train/liger.py, ``model.kernels``) patches transformers' module-level classes of a model family
as well as the policy it is given, so a model of that family built later in the same process is made of
liger's own classes (``LigerRMSNorm``, ``LigerSwiGLUMLP``), whose forwards are Triton GPU kernels: on a CPU
they fail with Triton's "cannot be accessed from Triton (cpu tensor?)". That happens to a rollout worker on
the CPU beside a trainer on a card (``rollout.async_worker_device=cpu``: its copy is unpickled as liger's
classes where the policy was built after the patch) and to a CPU run after a card run in one process
(a notebook). ``to_torch`` gives such layers a class of their own that computes the same values with
torch's ops, and puts back what liger rebound in transformers' modules (its rotary function lives only there)
from ``ORIGINALS``, which train/liger.py records as liger patches; any other liger class, or a rebinding nobody
recorded, is refused in one sentence (it would fail at its first call).

The math follows liger's RMSNorm casting modes (its ``casting_mode``): "llama" normalises in float32 and
casts back before the weight, "gemma" also multiplies in float32, "none" computes in the input's dtype;
``offset`` is added to the weight (Gemma's ``1 + w``).
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn.functional as F

from grpokit.config.sections import ConfigError

ORIGINALS: dict[str, dict[str, object]] = {}
"""What liger-kernel rebound in transformers' modules: module name -> attribute -> what it held before the first
patch (recorded by ``recording`` around train/liger.py's call), put back by ``to_torch`` for a run off CUDA."""


@contextlib.contextmanager
def recording():
    """Record in ORIGINALS each attribute of a loaded ``transformers.models`` module that the block rebinds."""
    before = {name: dict(vars(m)) for name, m in list(sys.modules.items()) if name.startswith("transformers.models.")}
    yield
    for name, held in before.items():
        now = vars(sys.modules[name])
        for k, v in held.items():
            if now.get(k, v) is not v:
                ORIGINALS.setdefault(name, {}).setdefault(k, v)


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
    and attributes stay) and put back what liger rebound in the modules its layers come from (the rotary
    embedding's function: module-level only); returns how many layers. Refuses any other liger class, and a
    rebinding nobody recorded (``where``: the device, for the message)."""
    refuse_untranslatable(model, where)
    _restore_modules(model, where)
    layers = liger_layers(model)
    for m in layers:
        m.__class__ = _torch_class(m)
    return len(layers)


def _restore_modules(model: torch.nn.Module, where: str) -> None:
    for name in sorted({type(m).__module__ for m in model.modules()}):
        module = sys.modules.get(name) if name.startswith("transformers.") else None
        for k, v in list(vars(module).items()) if module is not None else []:
            if not str(getattr(v, "__module__", "")).startswith("liger_kernel."):
                continue
            original = ORIGINALS.get(name, {}).get(k)
            if original is None:
                raise ConfigError(
                    f"{name}.{k} is liger-kernel's (model.kernels patched transformers on a card earlier in this "
                    f"process), which runs on CUDA only, and {where} has none: start the run in a fresh process"
                )
            setattr(module, k, original)
