"""Stage 2 on transformers: sample G completions per prompt with a lean batched decode loop.

Why not ``model.generate``: GRPO samples G completions of the *same* prompt, so the prompt's
key/value cache is computed once per prompt and then repeated G times (``batch_repeat_interleave``)
instead of being recomputed G times; and rows that have finished (EOS or a stop string) are dropped
from the cache as the batch shrinks, so little compute is spent decoding padding (they are dropped
in bunches, a quarter of the batch at a time, since each drop copies the cache). Finished rows still
in the cache sample nothing, so every engine draws the same random numbers. Per token we keep the
sampled id and its sampling log-probability; per completion its finish reason.

With ``repetition_penalty`` != 1 the penalty is applied before temperature and the filters, as
transformers does, and the recorded sampling log-probabilities are those of the penalised
distribution the tokens were drawn from (what TIS compares the trainer's log-probabilities with);
the trainer's own log-probabilities never see the penalty, as in TRL. The seen tokens are the
prompt's (without padding) and the completion's.

Sampling is seeded through an explicit ``torch.Generator`` so a resumed run samples exactly what an
uninterrupted one would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.data.vision import forward_kwargs, hide_placeholders, placeholder_ids
from grpokit.nn import vocab
from grpokit.types import Rollout

from . import hf_generate, static
from .sampling import SamplingParams, penalize_repetition, sample_tokens, seen_tokens


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    group_size: int,
    params: SamplingParams,
    *,
    eos_token_ids: set[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
    decode=None,
    engine: str = "auto",
    cuda_graphs: bool = True,
    vision: list[dict] | None = None,  # image prompts: P dicts of image inputs (see _prefill)
    generation_kwargs: dict | None = None,
) -> Rollout:
    """Sample ``group_size`` completions for each prompt.

    Args:
        model: a transformers causal LM.
        prompt_ids: P token-id lists (no padding).
        group_size: G; completions of prompt p are rows p*G .. p*G+G-1 of the result.
        params: sampling controls.
        eos_token_ids: ids that end a completion (finish reason "eos"; the token is kept).
        pad_token_id: id used to pad prompts on the left.
        generator: torch RNG for sampling (seeded by the caller).
        decode: ``ids -> str``, needed only when ``params.stop`` is non-empty.
        engine: ``"static"`` decodes with ``StaticDecoder`` (pre-allocated cache, lean step; Llama /
            Qwen2 / Mistral shapes and Qwen2-VL's language model), ``"dynamic"`` with the model's own
            forward and ``DynamicCache``; ``"auto"`` picks static where supported. Both sample the same tokens.
            ``"generate"`` calls transformers' ``model.generate`` (rollout/hf_generate.py: beam search
            and the other ``generation_kwargs``; no sampling logprobs, no image prompts).
        cuda_graphs: on CUDA, replay the static engine's step as CUDA graphs (static.py); the
            sampled tokens are the same.
        vision: image prompts: P dicts of the processor's image tensors, one per prompt; they enter
            the prefill only (both engines), whose cache the G samples share.
        generation_kwargs: engine "generate" only: extra ``GenerationConfig`` settings.
    """
    use_static = _uses_static(model, engine, vision, generation_kwargs)
    if use_static is None:  # engine "generate"
        return hf_generate.generate(
            model,
            prompt_ids,
            group_size,
            params,
            eos_token_ids=eos_token_ids,
            pad_token_id=pad_token_id,
            generator=generator,
            decode=decode,
            generation_kwargs=generation_kwargs,
        )
    d = _prefill(model, prompt_ids, group_size, params, pad_token_id, use_static, cuda_graphs, vision)
    tokens, logps, reasons = _decode_loop(
        model, d, prompt_ids, group_size, params, eos_token_ids, pad_token_id, generator, decode
    )
    return Rollout(
        prompt_ids=[list(p) for p in prompt_ids],
        completion_ids=tokens,
        sampling_logprobs=logps,
        finish_reasons=reasons,
        group_size=group_size,
        vision=None if vision is None else [v for v in vision for _ in range(group_size)],
    )


def _decode_loop(
    model,
    d: _Decoding,
    prompt_ids: list[list[int]],
    group_size: int,
    params: SamplingParams,
    eos_token_ids: set[int],
    pad_token_id: int,
    generator: torch.Generator | None,
    decode,
) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """Sample token after token from the prefilled state ``d`` until every row has finished (or
    ``max_new_tokens``): each row's tokens, their sampling logprobs and its finish reason.

    On a device of ``AHEAD_DEVICES`` the next step is queued before the host reads the tokens just
    drawn: the host's bookkeeping (the tokens' copy, finish checks, stop strings) runs while the
    device computes, not between its steps. Rows that finish are then retired one step later, and
    the step queued meanwhile decodes them once more, its output unused: the same tokens, at most
    one extra step of work when the last rows finish."""
    N = len(prompt_ids) * group_size
    tokens: list[list[int]] = [[] for _ in range(N)]
    logps: list[list[float]] = [[] for _ in range(N)]
    reasons = ["length"] * N
    ahead = d.device.type in AHEAD_DEVICES
    triton = vocab.marked(model)  # model.vocab_kernels: draw with nn/vocab.py's kernel where it can read the logits
    seen = (
        seen_tokens(prompt_ids, group_size, d.logits.shape[-1], d.device) if params.repetition_penalty != 1.0 else None
    )
    for step in range(params.max_new_tokens):
        row_ids = d.active if d.live is None else d.active[d.live]  # original row of each live row
        live_logits = d.logits if d.live is None else d.logits[d.live]
        if seen is not None:
            live_logits = penalize_repetition(live_logits, seen[row_ids], params.repetition_penalty)
        tok, tok_logp = sample_tokens(live_logits, params, generator, triton)
        if seen is not None:
            seen[row_ids, tok] = True
        drawn = _Drawn(row_ids, tok, tok_logp)  # their copy to the host starts now
        last = step == params.max_new_tokens - 1
        if ahead and not last:
            _feed(model, d, tok, pad_token_id)
        finished = _record(drawn, eos_token_ids, tokens, logps, reasons, params.stop, decode)
        if last or all(finished):
            break
        keep = _retire(d, finished, queued=ahead) if any(finished) else None
        if not ahead:
            _feed(model, d, tok if keep is None else tok[keep], pad_token_id)
    return tokens, logps, reasons


# Devices whose decode loop queues the next step before reading the last one's tokens (an
# H100 profile of a 512-row decode: ~1.7 ms of host work between steps of ~6.9 ms of GPU work).
# On CPU the work is synchronous either way, and running ahead would only add the extra step.
AHEAD_DEVICES = ("cuda",)


def _uses_static(model, engine: str, vision, generation_kwargs) -> bool | None:
    """Whether ``engine`` decodes with the static loop (False: dynamic; None: transformers' generate())."""
    if engine not in ("auto", "static", "dynamic", "generate"):
        raise ValueError(f"engine must be auto, static, dynamic or generate, got {engine!r}")
    if engine == "generate":
        if vision is not None:
            raise ValueError("engine='generate' does not take image prompts; use engine auto, static or dynamic")
        return None
    if generation_kwargs:
        raise ValueError(f"generation_kwargs {generation_kwargs} need engine='generate', got engine={engine!r}")
    if engine == "static" and not static.supports(model):
        raise ValueError(f"engine='static' does not support model type {getattr(model.config, 'model_type', '?')!r}")
    return engine == "static" or (engine == "auto" and static.supports(model))


@dataclass
class _Decoding:
    """The decode batch between steps. Cache rows and live rows differ: a finished row stays in the
    cache (decoding padding) until finished rows are COMPACT_FRACTION of it; then one copy drops them
    all (see compact_due)."""

    cache: Any  # the model's DynamicCache, or a StaticDecoder
    logits: torch.Tensor  # (cache rows, V) of the next token
    mask: torch.Tensor  # (cache rows, width) attention mask so far
    next_pos: torch.Tensor  # (cache rows, 1) position of the next token
    active: torch.Tensor  # original row of each cache row
    live: torch.Tensor | None  # cache rows still sampling; None = all of them
    use_static: bool
    device: torch.device
    compactable: bool = True  # the cache can drop rows (not a hybrid model's linear-attention / state layers)
    hidden: list[int] = field(default_factory=list)  # image placeholder ids never sampled (image prompts)


def _prefill(
    model,
    prompt_ids: list[list[int]],
    G: int,
    params: SamplingParams,
    pad_token_id: int,
    use_static: bool,
    cuda_graphs: bool,
    vision: list[dict] | None = None,
) -> _Decoding:
    """Left-pad the P prompts, prefill once per prompt, then share the prompt's cache with its G samples.
    Image prompts (``vision``) enter here only: their images are in the cache the G samples share."""
    device = next(model.parameters()).device
    P, width = len(prompt_ids), max(len(p) for p in prompt_ids)
    ids = torch.full((P, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((P, width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
    extra = {}
    if vision is not None:  # images: the model's own multimodal positions; text after them counts on by one
        extra = forward_kwargs(model, ids, mask, vision)
        pos = extra.pop("position_ids", pos)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1, **extra)
    # M-RoPE: the last (text) token has equal positions in all 3 axes, the prompt's largest; decoding
    # goes on from it + 1 (not from the token count: an image's tokens share positions), both engines
    pos = pos[0] if pos.dim() == 3 else pos
    cache = out.past_key_values
    rows = _row_ops(cache)
    if not use_static and G > 1 and not rows and vision is None:
        # a hybrid cache (NemotronH's Mamba layers ...) cannot copy a prompt's rows: prefill each sample
        ids, mask, pos = (t.repeat_interleave(G, dim=0) for t in (ids, mask, pos))
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        cache, G, P = out.past_key_values, 1, P * G
    if use_static:
        cache = static.StaticDecoder.from_prefill(model, cache, mask, G, params.max_new_tokens, graphs=cuda_graphs)
    elif G > 1:
        cache.batch_repeat_interleave(G)
    hidden = placeholder_ids(model) if vision is not None else []
    logits = hide_placeholders(out.logits[:, -1], hidden).repeat_interleave(G, dim=0)  # (N, V)
    next_pos = pos[:, -1:].repeat_interleave(G, dim=0) + 1  # (N, 1)
    return _Decoding(
        cache,
        logits,
        mask.repeat_interleave(G, dim=0),
        next_pos,
        torch.arange(P * G, device=device),
        None,
        use_static,
        device,
        use_static or rows,
        hidden,
    )


def _row_ops(cache) -> bool:
    """Whether every layer of the cache can repeat and drop rows: attention layers can, the
    linear-attention / state-space layers of hybrid models (transformers' LinearAttentionLayer) cannot."""
    layers = getattr(cache, "layers", None) or []
    return all(hasattr(x, "batch_repeat_interleave") and hasattr(x, "batch_select_indices") for x in layers)


class _Drawn:
    """One step's drawn tokens and log-probabilities on their way to the host: on CUDA an
    asynchronous copy into pinned memory and an event, so that reading them waits for this step's
    sampling only, not for a next step queued after it."""

    def __init__(self, row_ids: torch.Tensor, tok: torch.Tensor, logp: torch.Tensor):
        self.event = None
        if tok.device.type == "cuda":
            pinned = lambda t: torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
            row_ids, tok, logp = pinned(row_ids), pinned(tok), pinned(logp)
            self.event = torch.cuda.Event()
            self.event.record()
        self.parts = (row_ids, tok, logp)

    def lists(self) -> tuple[list[int], list[int], list[float]]:
        if self.event is not None:
            self.event.synchronize()
        return tuple(t.tolist() for t in self.parts)


def _record(drawn: _Drawn, eos: set[int], tokens, logps, reasons, stop: tuple[str, ...], decode) -> list[bool]:
    """Append each live row's token and log-probability; returns which of them finished (EOS, or a stop string)."""
    rows, tok_list, lp_list = drawn.lists()
    if math.isnan(sum(lp_list)):  # one C-level pass; a drawn token's log-probability is finite otherwise
        j = next(j for j, v in enumerate(lp_list) if math.isnan(v))
        raise FloatingPointError(
            f"rollout: the model's next-token log-probabilities are NaN (completion {rows[j]}, token "
            f"{len(tokens[rows[j]])}): its weights or activations hold NaN or inf (a diverged update, float16 "
            "overflow); resume from an earlier checkpoint with a lower optim.lr, or use model.dtype=bfloat16 or float32"
        )
    finished = [t in eos for t in tok_list]
    for j, r in enumerate(rows):
        tokens[r].append(tok_list[j])
        logps[r].append(lp_list[j])
        if finished[j]:
            reasons[r] = "eos"
    if stop and decode is not None:
        for j, r in enumerate(rows):
            if not finished[j] and _hits_stop(decode(tokens[r]), stop):
                reasons[r] = "stop"
                finished[j] = True
    return finished


def _retire(d: _Decoding, finished: list[bool], queued: bool) -> torch.Tensor:
    """Take the rows that finished (``finished``, one flag per live row) out of the live set, and drop
    all finished rows from the cache when enough have gathered (compact_due). ``queued``: a step was
    queued ahead on the rows as they were, so its logits are re-indexed too. Returns the indices
    (among the live rows) of those that go on."""
    keep = torch.tensor([j for j, f in enumerate(finished) if not f], dtype=torch.long, device=d.device)
    d.live = keep if d.live is None else d.live[keep]
    if d.compactable and compact_due(len(d.active), d.live.numel()):
        # drop the finished rows from the cache: no compute spent on them from now on
        d.cache.select(d.live) if d.use_static else d.cache.batch_select_indices(d.live)
        d.active, d.mask, d.next_pos = d.active[d.live], d.mask[d.live], d.next_pos[d.live]
        if queued:
            d.logits = d.logits[d.live]
        d.live = None
    return keep


def _feed(model, d: _Decoding, tok: torch.Tensor, pad_token_id: int) -> None:
    """Feed one sampled token per live row (finished rows still in the cache get padding; their
    outputs are ignored) and set ``d.logits`` to the next step's."""
    if d.live is not None:
        tok = torch.full_like(d.active, pad_token_id).index_put_((d.live,), tok)
    if d.use_static:
        d.logits = hide_placeholders(d.cache.step(tok, d.next_pos), d.hidden)
    else:
        d.mask = torch.cat([d.mask, torch.ones_like(d.mask[:, :1])], dim=1)
        out = model(
            input_ids=tok[:, None],
            attention_mask=d.mask,
            position_ids=d.next_pos,
            past_key_values=d.cache,
            use_cache=True,
        )
        d.cache, d.logits = out.past_key_values, hide_placeholders(out.logits[:, -1], d.hidden)
    d.next_pos = d.next_pos + 1


# Finished rows leave the decode batch once they are this fraction of it (or all of it). Dropping a
# row copies every live row's cache; a finished row kept costs one row of each later step. Lazily,
# the copies are few, and the batch keeps few distinct sizes (each new size builds new oneDNN kernels).
COMPACT_FRACTION = 0.25


def compact_due(cache_rows: int, live_rows: int) -> bool:
    """Whether to drop the finished rows now: ``cache_rows - live_rows`` of ``cache_rows`` have finished."""
    return cache_rows - live_rows >= max(1, COMPACT_FRACTION * cache_rows)


def _hits_stop(text: str, stops: tuple[str, ...]) -> bool:
    return any(s in text for s in stops)
