"""A frozen copy of a model (the reference policy, the async sampler's snapshot), whether some of its
attention layers see only a window of the past (the lean decode and packing paths step aside), and
the attention kernels transformers offers."""

from __future__ import annotations

import copy
import types
import weakref

import torch

ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
"""model.attn_implementation's values: "auto" leaves the choice to transformers, the rest are its names."""
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")
"""The kernels that take a packed row's sequence boundaries without an (S, S) mask: variable-length
flash kernels and FlexAttention's block-sparse document mask (train/packing.py)."""


def has_sliding_window(config, backbone: torch.nn.Module | None = None) -> bool:
    """True when some attention layer sees only a window of the past (Qwen2's ``use_sliding_window``,
    Mistral's ``sliding_window``, transformers' ``has_sliding_layers``): the lean paths that assume
    full attention everywhere (static decode, prompt sharing) then step aside."""
    if getattr(config, "use_sliding_window", False) or getattr(backbone, "has_sliding_layers", False):
        return True
    return getattr(config, "model_type", None) == "mistral" and bool(getattr(config, "sliding_window", None))


def sampling_snapshot(model: torch.nn.Module) -> tuple[torch.nn.Module, int]:
    """``(snapshot, bytes copied)``: a frozen copy of ``model`` to sample with while the live model trains
    (rollout/async_.py), which shares the live model's frozen parameters instead of copying them. Those
    never change during training, so with LoRA only the adapter tensors (and ``modules_to_save``, every
    trainable tensor) travel, plus the small buffers; a fully trained model is copied whole, as
    ``frozen_copy``. Sharing is read-only: the snapshot's copied tensors are its own, and nothing writes
    the shared ones. The bytes are what the sync moved (``rollout/weight_sync_bytes``)."""
    frozen = {id(p): p for p in model.parameters() if not p.requires_grad}
    snap = copy.deepcopy(model, memo=dict(frozen))  # deepcopy returns a memo entry as is: shared, not copied
    snap.eval()
    unbind_cycles(snap)
    copied = 0
    for p in snap.parameters():  # each tensor once, tied weights included
        if id(p) not in frozen:
            p.requires_grad_(False)
            copied += p.numel() * p.element_size()
    copied += sum(b.numel() * b.element_size() for b in snap.buffers())
    return snap, copied


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The reference policy: an in-memory copy with gradients off."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


class WeakBound:
    """``func`` bound to ``module`` as a method is, without holding the module: ``module.forward = method`` makes
    module -> method -> module a reference cycle, which keeps the module and its weights alive until Python's cycle
    collector runs rather than until the last reference goes. ``__func__`` is the function, as a method's."""

    __slots__ = ("__func__", "_module")

    def __init__(self, func, module: torch.nn.Module):
        self.__func__, self._module = func, weakref.ref(module)

    def __call__(self, *args, **kwargs):
        return self.__func__(self._module(), *args, **kwargs)

    def __deepcopy__(self, memo):  # as a bound method's copy: bound to the module's copy
        return WeakBound(self.__func__, copy.deepcopy(self._module(), memo))


def unbind_cycles(model: torch.nn.Module) -> int:
    """Turn every method bound to one of ``model``'s own modules in its instance dict (oneDNN's routed linears,
    liger-kernel's layers, model.lm_head_fp32's head) into a ``WeakBound``; returns how many. For the asynchronous
    sampler's per-step snapshots: each would otherwise outlive its version until the cycle collector ran (a CPU run
    held one copy of the policy per step that way, tests/train/test_no_tensor_cycles.py)."""
    n = 0
    for m in model.modules():
        for name, value in list(vars(m).items()):
            if isinstance(value, types.MethodType) and value.__self__ is m:
                vars(m)[name] = WeakBound(value.__func__, m)
                n += 1
    return n
