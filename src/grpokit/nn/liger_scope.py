"""liger-kernel's patch kept to the policy it was given.

liger-kernel's apply function (train/liger.py, ``model.kernels``) patches the policy's modules and also rebinds names
in transformers' module of the family: its classes (``Qwen2RMSNorm = LigerRMSNorm``, ``Qwen2MLP = LigerSwiGLUMLP``)
and its rotary function (``apply_rotary_pos_emb``), which the policy's attention looks up at every call. Left so,
every model of the family built later in the process is made of liger's Triton layers, which fail on a CPU ("cannot
be accessed from Triton (cpu tensor?)", an H200 run of 2026-11-30: a rollout worker on the CPU beside a trainer on
the card), and so do a reward model on the CPU, a CPU run after a card run (a notebook), and pickle of the policy's
own layers (their class names now hold liger's). ``scoped`` runs the apply function and then puts every rebound
class back, and turns every rebound function into one that calls liger's on CUDA tensors and the original on any
other device: the policy keeps its kernels, and nothing else in the process changes what it computes.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch


class OnCuda:
    """``kernel`` for calls whose first tensor argument is on CUDA, ``original`` for every other call."""

    def __init__(self, kernel: Callable, original: Callable):
        self.kernel, self.original = kernel, getattr(original, "original", original)  # never an OnCuda in an OnCuda

    def __call__(self, *args, **kwargs):
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        return (self.kernel if first is not None and first.is_cuda else self.original)(*args, **kwargs)


def scoped(apply: Callable[[], object]) -> None:
    """Run ``apply`` (liger-kernel's patch of one model); then, in every loaded ``transformers.models`` module, put
    back each class it rebound and make each function it rebound an ``OnCuda`` (also when ``apply`` raises)."""
    before = {name: dict(vars(m)) for name, m in list(sys.modules.items()) if name.startswith("transformers.models.")}
    try:
        apply()
    finally:
        for name, held in before.items():
            module = sys.modules[name]
            for key, was in held.items():
                now = vars(module).get(key, was)
                if now is was:
                    continue
                setattr(module, key, was if isinstance(was, type) else OnCuda(now, was))
