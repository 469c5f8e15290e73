"""Watch what a vision-language model's forward passes receive: the image tokens in ``input_ids`` and the
rows of ``pixel_values`` beside them (a model that got placeholders without pixels shows ``(t, 0)``)."""

from __future__ import annotations

import functools

import pytest


def spy_image_forwards(monkeypatch: pytest.MonkeyPatch, cls) -> list[tuple[int, int]]:
    """Patch ``cls.forward`` (a vision-language model class) for the test; every call appends
    ``(image tokens in input_ids, pixel_values rows)`` to the returned list. The wrapper keeps the
    forward's signature, which TRL's generate() reads."""
    seen: list[tuple[int, int]] = []
    forward = cls.forward

    @functools.wraps(forward)
    def spy(self, *a, **k):
        ids = k.get("input_ids")
        tokens = int((ids == self.config.image_token_id).sum()) if ids is not None else 0
        seen.append((tokens, 0 if k.get("pixel_values") is None else k["pixel_values"].shape[0]))
        return forward(self, *a, **k)

    monkeypatch.setattr(cls, "forward", spy)
    return seen


def sample_image_prompts(model, tokenizer, prompts, max_new_tokens: int, seed: int = 0, group_size: int = 2):
    """The HF engine's rollout of ``prompts`` (with their images), ``group_size`` samples each, seeded."""
    import torch

    from grpokit.rollout.hf import SamplingParams, generate

    return generate(
        model,
        [p.ids for p in prompts],
        group_size,
        SamplingParams(max_new_tokens=max_new_tokens),
        eos_token_ids={tokenizer.eos_token_id},
        pad_token_id=tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(seed),
        vision=[p.vision for p in prompts],
    )
