"""A frozen copy of a model (the reference policy, the async sampler's snapshot), whether some of its
attention layers see only a window of the past (the lean decode and packing paths step aside), and
the attention kernels transformers offers."""

from __future__ import annotations

import copy

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


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The reference policy: an in-memory copy with gradients off."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
