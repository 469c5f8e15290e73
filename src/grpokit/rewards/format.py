"""Format rewards: does the completion have the shape we asked for?

All three take `completions` (strings, or TRL's conversational lists) and return one float each.

- strict_format: 1.0 iff the whole completion is `<think>R</think>` then optional whitespace then
  `<answer>A</answer>`, then nothing but optional trailing whitespace; R and A must not contain the
  tags themselves. Else 0.0.
- tag_count: 0.25 for each of `<think>`, `</think>`, `<answer>`, `</answer>` that appears exactly once
  (partial credit while the model learns the format). Range [0, 1].
- reasoning_steps: min(k, cap) / cap where k counts step markers: lines starting "Step N", "N." or
  "N)", bullets "-"/"*", and the words "First,", "Second,", "Next,", "Then,", "Finally,". cap = 3 by
  default (R1-style shaping: three or more steps earn the full 1.0).
"""
from __future__ import annotations

import re
from typing import Any

from grpokit.rewards.math import completion_text

TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_STRICT = re.compile(r"<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)
_STEP = re.compile(r"(?m)^\s*(?:step\s*\d+\b|\d+[.)]\s|[-*]\s)|\b(?:first|second|next|then|finally),", re.IGNORECASE)


def strict_format(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 for exactly `<think>...</think><answer>...</answer>` with nothing after, else 0.0."""
    out = []
    for c in completions:
        m = _STRICT.fullmatch(completion_text(c))
        ok = m is not None and not any(t in m["think"] or t in m["answer"] for t in TAGS)
        out.append(1.0 if ok else 0.0)
    return out


def tag_count(completions: list[Any], **kwargs: Any) -> list[float]:
    """0.25 per format tag that occurs exactly once: sum over the 4 tags of 0.25 * [count == 1]."""
    return [sum(0.25 for t in TAGS if completion_text(c).count(t) == 1) for c in completions]


def reasoning_steps(completions: list[Any], cap: int = 3, **kwargs: Any) -> list[float]:
    """min(number of step markers, cap) / cap."""
    if cap < 1:
        raise ValueError(f"reasoning_steps: cap must be >= 1, got {cap}.")
    return [min(len(_STEP.findall(completion_text(c))), cap) / cap for c in completions]
