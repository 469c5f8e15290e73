"""Stage 2 through transformers' own ``model.generate`` (``rollout.engine=generate``).

hf.py's loops implement plain sampling (temperature, top-k/p, min-p, repetition penalty) and nothing
else. This engine exists for the decoding strategies only ``generate`` has: beam search
(``num_beams``, ``length_penalty``), ``no_repeat_ngram_size``, ``typical_p`` and the rest of
``GenerationConfig``. It does what TRL's transformers path does: each prompt is repeated G times
(one completion per row, ``num_return_sequences`` 1), and a ``GenerationConfig`` is built from the
sampling settings with ``rollout.generation_kwargs`` on top. Every setting grpokit has is passed
explicitly (top_k 0, top_p 1.0 when off), and the model's generation_config.json is set aside for
the call, so what the model's authors chose for chat (Qwen's top_p 0.8, top_k 20) does not creep
in: the engines sample alike, as the vLLM ones send every field.

No sampling log-probabilities are recorded: under beam search a token has no sampling probability,
and ``output_scores`` would hold (rows, vocabulary) floats for every step. The rows carry zeros,
which tis.sampled_rows reads as "not scored by a sampler", so mismatch masking and its metrics leave
them out, and the old log-probabilities come from the training pass (as TRL, whose logprobs are None
on this path). validation/rollout.py keeps this engine off the paths that would weigh by sampler
log-probabilities (vLLM, asynchronous sampling).

``generate`` draws from torch's global RNG; it is seeded from the run's generator inside
``fork_rng`` so a resumed run samples what an uninterrupted one would and nothing else is disturbed.
"""

from __future__ import annotations

import contextlib

import torch

from grpokit.types import Rollout

from .static import unwrapped


def generation_config(params, generation_kwargs: dict, eos_token_ids: set[int], pad_token_id: int):
    """transformers' ``GenerationConfig`` for ``params`` (sampling.SamplingParams) with ``generation_kwargs``
    on top. When it samples, every sampling setting is explicit, as TRL passes them: transformers fills a
    setting left None from the model's generation_config.json, then from its own defaults (top_k 50), so
    None would not mean "off"; top_k 0, top_p 1.0 and repetition_penalty 1.0 are transformers' own "off"
    values. Temperature 0 (or ``do_sample`` False in ``generation_kwargs``) is greedy: no warper runs."""
    from transformers import GenerationConfig

    sampled = params.temperature > 0 and bool(generation_kwargs.get("do_sample", True))  # 0: greedy, always
    kw: dict = {
        "max_new_tokens": params.max_new_tokens,
        "eos_token_id": sorted(eos_token_ids),
        "pad_token_id": pad_token_id,
        "do_sample": sampled,
        "num_beams": 1,
        "num_return_sequences": 1,
        "repetition_penalty": params.repetition_penalty,
    }
    if sampled:
        kw.update(
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            min_p=params.min_p or None,  # None is transformers' only "off" for min-p (only_given_settings keeps it)
        )
    kw.update({k: v for k, v in generation_kwargs.items() if k != "do_sample"})  # decided above
    return GenerationConfig(**kw, disable_compile=True)


@contextlib.contextmanager
def only_given_settings(model):
    """While ``generate`` runs, the model's own generation_config is transformers' defaults: what a
    config leaves None (min-p, suppressed or bad words, n-gram blocking ...) is not filled from the
    model's generation_config.json, which grpokit's other engines never read either. Put back after."""
    from transformers import GenerationConfig

    base = unwrapped(model)  # PEFT: the wrapped model's
    own = getattr(base, "generation_config", None)
    if own is None:
        yield
        return
    base.generation_config = GenerationConfig()
    try:
        yield
    finally:
        base.generation_config = own


@torch.no_grad()
def generate(
    model,
    prompt_ids: list[list[int]],
    group_size: int,
    params,
    *,
    eos_token_ids: set[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
    decode=None,
    generation_kwargs: dict | None = None,
) -> Rollout:
    """``group_size`` completions per prompt from ``model.generate``: rows p*G .. p*G+G-1 are prompt
    p's. A completion ends after its first EOS token (kept; reason "eos"), after the token that
    completes a stop string (reason "stop"; needs ``decode``), or at ``params.max_new_tokens``
    (reason "length"), as hf.generate's."""
    device = next(model.parameters()).device
    G, width = group_size, max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompt_ids):  # left padding, as hf.py: every completion starts at column `width`
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.repeat_interleave(G, dim=0).to(device), mask.repeat_interleave(G, dim=0).to(device)
    config = generation_config(params, generation_kwargs or {}, eos_token_ids, pad_token_id)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator)) if generator is not None else None
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        with only_given_settings(model):
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    tokens, reasons = completions(out[:, width:].tolist(), eos_token_ids, params.stop, decode)
    return Rollout(
        prompt_ids=[list(p) for p in prompt_ids],
        completion_ids=tokens,
        sampling_logprobs=[[0.0] * len(t) for t in tokens],
        finish_reasons=reasons,
        group_size=G,
    )


def completions(
    rows: list[list[int]], eos_token_ids: set[int], stop: tuple[str, ...], decode
) -> tuple[list[list[int]], list[str]]:
    """Cut each generated row (padded on the right after its end) at its first EOS (kept) or at the
    token completing a stop string; returns the completions and their finish reasons."""
    tokens, reasons = [], []
    for row in rows:
        end = next((t + 1 for t, tok in enumerate(row) if tok in eos_token_ids), None)
        reason = "eos" if end is not None else "length"
        row = row[:end] if end is not None else row
        if stop and decode is not None:
            hit = next((t + 1 for t in range(len(row)) if any(s in decode(row[: t + 1]) for s in stop)), None)
            if hit is not None and (reason != "eos" or hit < len(row)):
                row, reason = row[:hit], "stop"
        tokens.append(row)
        reasons.append(reason)
    return tokens, reasons
