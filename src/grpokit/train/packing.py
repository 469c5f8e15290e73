"""Padding-free forward passes: the batch's sequences packed end to end into one dense row.

A padded (N, Lp + T) batch computes every padding column in every layer; with completions of very
different lengths (a 512-token cap, a median of 200) most of the update's FLOPs can be padding.
Packed, the real tokens of all N sequences (prompt + completion, no padding) sit in one row of S =
sum of lengths tokens, each sequence's positions restarting at 0. transformers reads sequence
boundaries from those positions when no attention mask is passed (``find_packed_sequence_indices``:
a position that does not follow its left neighbour by 1 starts a new sequence) and builds a causal
mask that never crosses a boundary: a block-diagonal mask for SDPA / eager / flex attention,
variable-length kernels for flash attention. So every token sees exactly what it saw padded, and
the per-token values equal the padded path's (tests/train/test_packing.py: float64, values and gradients).

Only the hidden states that predict completion tokens go on to the output layer (K of them, no
padding); the caller scatters the K results back into the (N, T) layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.nn.models import VARLEN_ATTENTION, has_sliding_window
from grpokit.types import TokenBatch

# Decoder families whose attention honours packed position ids (transformers' masking utilities);
# each is checked against the padded forward in tests/train/test_packing.py for llama and qwen2.
PACKING_TYPES = ("llama", "qwen2", "qwen3", "mistral")


@dataclass
class Packed:
    """One batch packed into a single row: ``input_ids`` / ``position_ids`` ``(1, S)``;
    ``state_index`` ``(K,)`` the packed position whose state predicts each real completion token,
    ``targets`` ``(K,)`` those tokens, ``slot`` ``(K,)`` where each lands in the flat ``(N * T)`` layout."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    state_index: torch.Tensor
    targets: torch.Tensor
    slot: torch.Tensor


def can_pack(model: torch.nn.Module, backbone: torch.nn.Module | None) -> bool:
    config = getattr(model, "config", None)
    return (
        backbone is not None
        and getattr(config, "model_type", None) in PACKING_TYPES
        and not has_sliding_window(config, backbone)
    )


# SDPA and eager attention get a dense block-diagonal (S, S) mask from transformers and compute every
# block of it, so a packed row is only worth it for them (and only fits: a whole GRPO batch of 512 x 560
# tokens is an 80 GB mask) when S is short; VARLEN_ATTENTION's kernels take any length.
DENSE_MASK_MAX_TOKENS = 4096


def mask_fits(model: torch.nn.Module, batch: TokenBatch) -> bool:
    """Whether ``model``'s attention kernel takes ``batch`` packed into one row (its real tokens), checked
    before packing: a variable-length kernel takes any length, a dense-mask kernel (SDPA, eager) at
    most DENSE_MASK_MAX_TOKENS tokens."""
    kernel = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return kernel in VARLEN_ATTENTION or int(batch.attention_mask.sum()) <= DENSE_MASK_MAX_TOKENS


def pack(batch: TokenBatch) -> Packed | None:
    """The batch's real tokens end to end, or None when a row has no prompt token (no state would
    predict its first completion token)."""
    N, T = batch.completion_ids.shape
    lp = batch.input_ids.shape[1] - T
    attn = batch.attention_mask.bool()
    prompt_len = attn[:, :lp].sum(dim=1)  # (N,)
    comp_len = attn[:, lp:].sum(dim=1)  # (N,) real completion tokens, environment tokens included
    if bool((prompt_len == 0).any()):
        return None
    lengths = prompt_len + comp_len
    starts = torch.cumsum(lengths, dim=0) - lengths  # (N,) packed offset of each sequence
    t = torch.arange(T, device=attn.device)
    real = t[None, :] < comp_len[:, None]  # (N, T)
    # the state at a sequence's position prompt_len - 1 + t predicts its completion token t
    state_NT = starts[:, None] + prompt_len[:, None] - 1 + t[None, :]
    slot_NT = torch.arange(N * T, device=attn.device).view(N, T)
    return Packed(
        batch.input_ids[attn][None],
        batch.position_ids[attn][None],
        state_NT[real],
        batch.completion_ids[real],
        slot_NT[real],
    )


def packed_states(backbone: torch.nn.Module, packed: Packed) -> torch.Tensor:
    """``(K, hidden)`` final hidden states that predict the packed batch's completion tokens."""
    out = backbone(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None, use_cache=False)
    return out.last_hidden_state[0].index_select(0, packed.state_index)


def unpack(values_K: torch.Tensor, packed: Packed, N: int, T: int) -> torch.Tensor:
    """``(N, T)`` with each of the K values at its slot and 0 on padding (differentiable)."""
    return values_K.new_zeros(N * T).index_copy(0, packed.slot, values_K).view(N, T)
