"""Shared-prefix passes (train.packing=prefix_tree): a micro-batch's sequences as one prefix tree in one row.

The G episodes of a prompt share the prompt, and multi-turn episodes often share their first turns
too (an environment's opening, a deterministic first answer). Packed end to end (packing.py), each
sequence still computes every shared token again. Here the sequences are inserted into a trie (a
node is a token with its whole prefix), each node becomes one position of a single packed row, its
position id is its depth, and a 4-D attention mask lets a node attend to exactly its ancestors and
itself: the path a sequence takes through the tree is what that sequence's own causal attention saw,
so every hidden state equals the unshared one, and the state that predicts a row's next token is
read at that row's node (two rows that part after a shared node read the same state for different
targets). The backward sums each shared state's gradient over the rows that continue it, which is
the unshared gradient up to float summation order (tests/train/test_prefix_tree.py, float64).

The mask is dense, (S, S) over the S distinct tokens, so this runs with SDPA and eager attention
(transformers passes a 4-D mask to them as it is); variable-length kernels take no such mask and are
refused (``refusal``). A micro-batch of more than packing.DENSE_MASK_MAX_TOKENS distinct tokens, or
one with a row without prompt tokens, runs padded and saves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.types import TokenBatch

from .packing import DENSE_MASK_MAX_TOKENS, PACKING_TYPES, Packed

TREE_ATTENTION = ("sdpa", "eager")  # attention kernels that take a custom 4-D mask as it is


@dataclass
class Tree:
    """A batch as a prefix tree in one row: ``packed`` (packing.py's record over the S distinct tokens),
    ``ancestors`` ``(S, S)`` bool (token j attends to token k: k is j or an ancestor of j) and ``saved``,
    the batch's real tokens minus S."""

    packed: Packed
    ancestors: torch.Tensor
    saved: int


def refusal(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot run shared-prefix passes (one sentence), or None when it can."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family not in PACKING_TYPES:
        return (
            f"train.packing=prefix_tree needs a decoder whose attention takes a 4-D mask ({', '.join(PACKING_TYPES)}); "
            f"this model is {family!r}: use train.packing=packed or padded"
        )
    kernel = getattr(config, "_attn_implementation", None)
    if kernel not in TREE_ATTENTION:
        return (
            f"train.packing=prefix_tree needs model.attn_implementation sdpa or eager (a dense 4-D mask); "
            f"this model runs {kernel!r}, which takes no such mask: use train.packing=packed, or sdpa"
        )
    return None


def build_tree(batch: TokenBatch) -> Tree | None:
    """The prefix tree of ``batch``'s real tokens (prompt and completion, environment tokens included), or
    None when a row has no prompt token or the tree has more than DENSE_MASK_MAX_TOKENS tokens."""
    N, T = batch.completion_ids.shape
    lp = batch.input_ids.shape[1] - T
    attn = batch.attention_mask.bool().cpu()
    prompt_len = attn[:, :lp].sum(dim=1)
    if lp == 0 or bool((prompt_len == 0).any()):
        return None
    ids = batch.input_ids.cpu()
    nodes: dict[tuple[int, int], int] = {}  # (parent node, token) -> node; the root's parent is -1
    tokens, depth, paths = [], [], []
    for i in range(N):
        path, parent = [], -1
        for tok in ids[i][attn[i]].tolist():
            node = nodes.get((parent, tok))
            if node is None:
                node = nodes[(parent, tok)] = len(tokens)
                tokens.append(tok)
                depth.append(len(path))
            path.append(node)
            parent = node
        paths.append(path)
    S = len(tokens)
    if S > DENSE_MASK_MAX_TOKENS:
        return None
    ancestors = torch.zeros((S, S), dtype=torch.bool)
    for path in paths:  # a node's ancestors are the same on every path through it
        p = torch.tensor(path)
        ancestors[p[:, None], p[None, :]] |= torch.ones(len(path), len(path), dtype=torch.bool).tril()
    comp_len = attn[:, lp:].sum(dim=1)
    state, target, slot = [], [], []
    for i, path in enumerate(paths):  # completion token t of row i is predicted at node path[prompt_len - 1 + t]
        n_p, n_c = int(prompt_len[i]), int(comp_len[i])
        state += path[n_p - 1 : n_p - 1 + n_c]
        target += batch.completion_ids[i, :n_c].tolist()
        slot += range(i * T, i * T + n_c)
    device = batch.input_ids.device
    as_long = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    packed = Packed(as_long([tokens]), as_long([depth]), as_long(state), as_long(target), as_long(slot))
    return Tree(packed, ancestors.to(device), int(attn.sum()) - S)


def tree_states(backbone: torch.nn.Module, tree: Tree, kernel: str | None) -> torch.Tensor:
    """``(K, hidden)`` final hidden states that predict the tree's completion tokens: one forward over the
    tree's row with its ancestor mask (boolean for SDPA, additive for eager attention, which adds it)."""
    mask = tree.ancestors[None, None]  # (1, 1, S, S)
    if kernel == "eager":
        dtype = next(backbone.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    out = backbone(
        input_ids=tree.packed.input_ids, position_ids=tree.packed.position_ids, attention_mask=mask, use_cache=False
    )
    return out.last_hidden_state[0].index_select(0, tree.packed.state_index)


def tokens_saved(batch: TokenBatch) -> int:
    """Tokens a shared-prefix pass over ``batch`` does not compute again (0 where it runs padded)."""
    tree = build_tree(batch)
    return tree.saved if tree is not None else 0
