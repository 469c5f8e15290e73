"""Stage 5a: per-token log-probabilities (and entropy) of completion tokens, chunked.

The policy's full logits for a batch are (N, L, V) floats: for a 150k vocabulary and long
completions that is the largest tensor of the whole step. We run the model's backbone once, keep
only the hidden states that predict completion tokens, and push them through the output layer a
block of positions at a time, so at most (chunk, V) logits exist at once. Logits are divided by
the loss temperature (algo.loss_temperature, by default rollout.temperature: the distribution that sampled).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from grpokit.data.vision import forward_kwargs, hide_placeholders, placeholder_ids
from grpokit.rollout.sampling import SamplingParams, support_log_mass, truncates
from grpokit.types import TokenBatch

from . import head as head_fn
from .hidden_states import completion_logits, completion_states, decoder_stack, sharded
from .packing import can_pack, mask_fits, pack, packed_states, unpack
from .prefix_tree import build_tree, tree_states


def completion_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    temperature: float = 1.0,
    chunk_size: int = 64,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    buckets: int | None = None,
    packed: bool = False,
    prefix_tree: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities ``(N, T)`` of the completion tokens under ``model`` and, optionally, the
    entropy ``(N, T)`` of each position's distribution (no gradient unless ``entropy_grad``).
    ``completion_logprobs_on_support`` adds the sampler's truncation, replayed.

    No compute on padding: rows are sorted by real length and split into up to ``buckets``
    contiguous groups (``None``: chosen by ``plan_buckets``); each group's columns are trimmed to
    its own longest prompt and completion. Positions are explicit, so trimming changes no value.
    Values at padded completion positions are 0 here and meaningless; callers mask them.
    ``packed``: one padding-free forward over the rows packed end to end (packing.py), where the
    model supports it; the values equal the padded path's. ``prefix_tree``: one forward over the rows'
    prefix tree, each shared prefix once (prefix_tree.py; train.packing=prefix_tree), same values.
    """
    lp, ent, _ = _completion_logprobs(
        model,
        batch,
        _Pass(temperature, chunk_size, with_entropy, entropy_grad, prefix_tree=prefix_tree),
        buckets,
        packed,
    )
    return lp, ent


def completion_logprobs_on_support(
    model: torch.nn.Module,
    batch: TokenBatch,
    support: SamplingParams,
    *,
    temperature: float,
    chunk_size: int = 64,
    with_entropy: bool = False,
    packed: bool = False,
    prefix_tree: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``completion_logprobs`` at ``temperature`` (the loss's: pi_old as the update's ratio divides by it; no
    gradient) plus ``(N, T)`` the log of the mass each position's distribution at that temperature puts on
    the tokens ``support``'s top-k / top-p / min-p keep at the sampler's own ``support.temperature``
    (rollout/sampling.py ``support_log_mass``; None where ``support`` truncates nothing). ``logp - mass``
    is pi_old renormalised over the sampler's support: the trainer's side of TIS and the mismatch metrics,
    while the loss keeps ``logp``. The two temperatures differ where only sampling was changed (a written
    generation_config.temperature, generation_kwargs' temperature under grpokit.trl, algo.loss_temperature)."""
    if torch.is_grad_enabled():
        raise ValueError("completion_logprobs_on_support runs without gradient (wrap it in torch.no_grad())")
    cut = support if truncates(support) else None
    fw = _Pass(temperature, chunk_size, with_entropy, False, cut, prefix_tree)
    return _completion_logprobs(model, batch, fw, None, packed)


@dataclass(frozen=True)
class _Pass:
    """How one log-probability pass runs: the temperature (the loss's), positions per head chunk, entropies (with
    their gradient or not), the sampler's truncation to replay (None: none; its own temperature picks the kept
    tokens) and whether rows share prefixes."""

    temperature: float
    chunk_size: int
    with_entropy: bool
    entropy_grad: bool
    support: SamplingParams | None = None
    prefix_tree: bool = False


def _completion_logprobs(model, batch: TokenBatch, fw: _Pass, buckets: int | None, packed: bool):
    """``(logp, entropy, support mass)`` ``(N, T)`` each (the last two None unless asked for)."""
    N, T = batch.completion_ids.shape
    if batch.vision is not None:  # image prompts: one whole multimodal forward (no trimming, no prompt sharing)
        return _vision_logprobs(model, batch, fw)
    if packed or fw.prefix_tree:
        out = _packed_logprobs(model, batch, fw)
        if out is not None:
            return out
    # FSDP2: length buckets would run each sharded unit several times before one backward; that is
    # not covered by our 2-rank tests, so sharded models keep one plain forward per micro-batch.
    if sharded(next(model.parameters())):
        return _logprobs_block(model, batch, fw, share_prompts=False)
    lengths = _completion_lengths(batch)  # (N,)
    groups = plan_buckets(lengths.tolist(), buckets)
    if len(groups) == 1 and groups[0].numel() == N and int(lengths.max().item()) == T:
        return _logprobs_block(model, batch, fw)
    parts: list[list[torch.Tensor]] = [[], [], []]
    order = torch.cat(groups)
    for rows in groups:
        sub, t_b = _trim(batch, rows.to(batch.input_ids.device))
        for kept, value in zip(parts, _logprobs_block(model, sub, fw)):
            if value is not None:
                kept.append(torch.nn.functional.pad(value, (0, T - t_b)))
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(N)
    inverse = inverse.to(parts[0][0].device)
    lp, ent, mass = (torch.cat(kept)[inverse] if kept else None for kept in parts)
    return lp, ent, mass


def logprobs_with_router_loss(model, batch: TokenBatch, temperature: float = 1.0, entropy_grad: bool = False):
    """``(logp, entropy, aux_loss)``, ``(N, T)`` each and a scalar: one forward of a Mixture-of-Experts
    model with its router logits on, whose load-balancing loss transformers returns as ``aux_loss``
    (over every attended token, prompt included, as TRL's forward computes it). The model's own
    forward: its logits for the completion positions are kept whole, not chunked."""
    T = batch.width
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=T + 1,
        output_router_logits=True,
        use_cache=False,
    )
    logp, ent, _ = _logp_entropy(out.logits[:, :-1], batch.completion_ids, _Pass(temperature, 0, True, entropy_grad))
    return logp, ent, out.aux_loss


def _vision_logprobs(model, batch, fw: _Pass):
    """Completion log-probabilities with the prompts' images in the forward (positions from the
    model's multimodal RoPE, as in the rollout's prefill); image tokens are prompt tokens, so they
    never reach the (N, T) result."""
    T = batch.width
    extra = forward_kwargs(model, batch.input_ids, batch.attention_mask, batch.vision)
    extra.setdefault("position_ids", None)
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=T + 1, **extra
    ).logits[:, :-1]
    logits = hide_placeholders(logits, placeholder_ids(model))  # as the rollout: placeholders are never sampled
    return _logp_entropy(logits, batch.completion_ids, fw)


def _completion_lengths(batch: TokenBatch) -> torch.Tensor:
    """Real completion tokens per row ``(N,)``: the attention mask after the prompt (environment
    tokens of an episode count; they are context even where the loss mask is 0)."""
    return batch.attention_mask[:, batch.input_ids.shape[1] - batch.width :].sum(dim=1).long()


def plan_buckets(lengths: list[int], buckets: int | None = None, row_cost: float = 4.0) -> list[torch.Tensor]:
    """Split rows into groups of similar completion length (row indices per group, shortest first).

    With ``buckets`` given, rows sorted by length are cut into that many equal groups. Otherwise
    k in {1, 2, 4, 8} is chosen to minimise padded tokens plus a fixed cost per group (each group
    is one more forward whose matmuls are smaller), counted as ``row_cost * N`` token slots.
    Example: lengths [2, 3, 30, 32] -> k = 2: groups [[0, 1], [2, 3]] cost 2*3 + 2*32 = 70 token
    slots (+ 2 * 16 overhead) against 4*32 = 128 (+ 16) for k = 1.
    """
    n = len(lengths)
    order = sorted(range(n), key=lambda i: lengths[i])

    def split(k):
        k = max(1, min(k, n))
        return [order[j * n // k : (j + 1) * n // k] for j in range(k)]

    def cost(groups):
        return sum(len(g) * max(1, max(lengths[i] for i in g)) for g in groups if g) + row_cost * n * len(groups)

    chosen = split(buckets) if buckets else min((split(k) for k in (1, 2, 4, 8) if k <= n), key=cost)
    return [torch.tensor(g, dtype=torch.long) for g in chosen if g]


def _trim(batch: TokenBatch, rows: torch.Tensor) -> tuple[TokenBatch, int]:
    """Rows ``rows`` of ``batch`` without all-padding columns: left of the earliest prompt token,
    right of the longest completion. Returns the sub-batch and its completion width."""
    T = batch.width
    lp = batch.input_ids.shape[1] - T
    attn = batch.attention_mask.index_select(0, rows)
    first = int(attn[:, :lp].any(dim=0).long().argmax().item()) if lp > 0 and bool(attn[:, :lp].any()) else lp
    t_b = max(1, int(_completion_lengths(batch).index_select(0, rows).max().item()))
    cols = slice(first, lp + t_b)
    pick = lambda t: t.index_select(0, rows)
    sub = TokenBatch(
        pick(batch.input_ids)[:, cols],
        attn[:, cols],
        pick(batch.position_ids)[:, cols],
        pick(batch.completion_ids)[:, :t_b],
        pick(batch.completion_mask)[:, :t_b],
    )
    return sub, t_b


def _logprobs_block(model, batch, fw: _Pass, share_prompts=True):
    T = batch.width
    h = completion_states(model, batch, share_prompts)
    if h is None:  # models whose logits need more than a linear head: one full forward
        return _logp_entropy(completion_logits(model, batch), batch.completion_ids, fw)
    N = h.shape[0]
    # One 2-D (positions, hidden) matrix, cut into row blocks: each chunk's head is one plain matmul.
    # Column slices of the (N, T, hidden) states are strided 3-D tensors, which the head ran as a
    # batched matmul over rows (an H100 spent 8.3 s of a 24 s step in it for a 512-row reference pass).
    out = _head_logprobs(
        model.get_output_embeddings(), h.reshape(N * T, h.shape[-1]), batch.completion_ids.reshape(N * T), N, fw
    )
    return tuple(v.view(N, T) if v is not None else None for v in out)


def _packed_logprobs(model, batch, fw: _Pass):
    """Padding-free logprobs (packing.py; prefix_tree.py with ``fw.prefix_tree``), or None when the
    model or batch cannot be packed."""
    backbone = decoder_stack(model)
    if fw.prefix_tree:
        tree = build_tree(batch) if backbone is not None else None
        if tree is None:
            return None
        packed, h = tree.packed, tree_states(backbone, tree, getattr(model.config, "_attn_implementation", None))
    else:
        packed = pack(batch) if can_pack(model, backbone) and mask_fits(model, batch) else None
        if packed is None:
            return None
        h = packed_states(backbone, packed)  # (K, hidden)
    N, T = batch.completion_ids.shape
    out = _head_logprobs(model.get_output_embeddings(), h, packed.targets, N, fw)
    return tuple(unpack(v, packed, N, T) if v is not None else None for v in out)


def _head_logprobs(head, flat_h, flat_t, rows: int, fw: _Pass):
    """``(K,)`` logprobs of ``flat_t`` under ``head(flat_h)`` (and entropies, support masses), at most a
    bounded (chunk, V) block of logits alive at a time (``fw.chunk_size`` positions of each of ``rows``)."""
    K, V = flat_h.shape[0], head.weight.shape[0]
    temperature, with_entropy, entropy_grad = fw.temperature, fw.with_entropy, fw.entropy_grad
    budget = LOGITS_CHUNK_ELEMENTS if flat_h.device.type == "cpu" else GPU_LOGITS_CHUNK_ELEMENTS
    chunk = max(1, min(fw.chunk_size * rows, budget // V))  # positions per chunk: a bounded (chunk, V) logits block
    # one function with a lighter backward (head.py), where the head is a plain, unsharded linear layer
    if head_fn.fusable(head, flat_h) and not entropy_grad and fw.support is None:
        return (*head_fn.head_logprobs(head, flat_h, flat_t, chunk, temperature, with_entropy), None)
    if fw.support is not None:  # the replay pass runs without gradient (completion_logprobs_on_support)
        chunk = max(1, min(chunk, REPLAY_CHUNK_ELEMENTS // V))  # top-p's sort holds ~8 (chunk, V) tensors at once
        outs = [_logp_entropy(head(flat_h[s : s + chunk]), flat_t[s : s + chunk], fw) for s in range(0, K, chunk)]
        return tuple(torch.cat([o[i] for o in outs]) if outs[0][i] is not None else None for i in range(3))
    if torch.is_grad_enabled() and K * V > SMALL_LOGITS_ELEMENTS:
        # Memory-flat: every chunk's logits are recomputed in the backward pass (activation
        # checkpointing), so one (chunk, V) block is alive at a time instead of all of them.
        # The same ops run as without it, so values and gradients are bit-identical, also under FSDP.
        def piece(h_c, t_c):
            lp, ent, _ = _logp_entropy(head(h_c), t_c, fw)
            return (lp, ent) if ent is not None else (lp,)

        outs = [
            checkpoint(piece, flat_h[s : s + chunk], flat_t[s : s + chunk], use_reentrant=False)
            for s in range(0, K, chunk)
        ]
        logps, ents = [o[0] for o in outs], [o[1] for o in outs if len(o) > 1]
    else:
        logps, ents = [], []
        for s in range(0, K, chunk):
            lp, ent, _ = _logp_entropy(head(flat_h[s : s + chunk]), flat_t[s : s + chunk], fw)
            logps.append(lp)
            ents += [ent] if ent is not None else []
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None), None


LOGITS_CHUNK_ELEMENTS = 1 << 23  # 8M floats = 32 MB per logits chunk (CPU: cache-sized blocks)
# GPU: 256M floats = 1 GB per chunk. Each chunk's backward adds a whole (V, h) gradient into the
# head's weight, so with a 151936-token vocabulary the CPU budget meant one column per chunk and
# thousands of full-size weight-gradient GEMMs per step (measured on an H100: 43 s of a 49 s step).
GPU_LOGITS_CHUNK_ELEMENTS = 1 << 28
# The truncation replay (support_log_mass) keeps several (chunk, V) tensors alive (sort values and indices,
# masks, the log-softmax): 64M elements (256 MB each in float32) bound its chunks on every device.
REPLAY_CHUNK_ELEMENTS = 1 << 26
# Below this many (N, T, V) logits (4 MB of fp32) recomputing them in the backward pass saves nothing
# worth its cost (one more head matmul and log-softmax per chunk): autograd keeps them instead.
SMALL_LOGITS_ELEMENTS = 1 << 20


def _logp_entropy(logits, targets, fw: _Pass):
    """``(logp, entropy, support mass)`` of ``targets`` under ``logits`` (..., V) at ``fw.temperature``."""
    z = logits if logits.dtype == torch.float64 else logits.float()  # half precision: log-softmax in float32
    t = fw.temperature
    logp_all = torch.log_softmax(z / t if t != 1.0 else z, dim=-1)
    logp = logp_all.gather(-1, targets[..., None])[..., 0]
    ent = mass = None
    if fw.with_entropy:
        src = logp_all if fw.entropy_grad else logp_all.detach()
        ent = -(src.exp() * src).sum(dim=-1)
    if fw.support is not None:
        flat = z.detach().reshape(-1, z.shape[-1])
        mass = support_log_mass(flat, targets.reshape(-1), fw.support, temperature=t).view(targets.shape)
    return logp, ent, mass
