"""Format rewards: does the completion have the shape we asked for?

All three take `completions` (strings, or TRL's conversational lists) and return one float each.
A format reward is easy to game (it never checks the answer), so each one only pays for the shape
honestly filled in:

- strict_format: 1.0 iff the whole completion is `<think>R</think>` then optional whitespace then
  `<answer>A</answer>`, then nothing but optional trailing whitespace; R and A must not contain the
  tags themselves (no repeated or nested tags) and must not be blank, and A must be an answer, not a
  placeholder (grpokit.rewards.answers.is_placeholder: "answer here", "...", `\\boxed{}`). Else 0.0.
- tag_count: 0.25 for each of `<think>`, `</think>`, `<answer>`, `</answer>` that appears exactly once
  (partial credit while the model learns the format). Range [0, 1]. Tags out of order earn 0.0 in
  total; a pair around blank content (`<answer> </answer>`), or an answer pair around a placeholder
  (`<answer> answer here </answer>`, the R1 template echoed), earns nothing for that pair.
- reasoning_steps: min(k, cap) / cap where k counts distinct steps: lines starting "Step N", "N." or
  "N)", bullets "-"/"*", and the words "First,", "Second,", "Next,", "Then,", "Finally,", each
  followed by at least one letter or digit of its own; a step whose text repeats an earlier step
  (ignoring case and spacing) is not counted again. cap = 3 by default (R1-style shaping: three or more
  steps earn the full 1.0).
"""

from __future__ import annotations

import re
from typing import Any

from .answers import is_placeholder
from .math import completion_text

TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_STRICT = re.compile(r"<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)
_STEP = re.compile(
    r"(?m)^\s*(?:step\s*\d+\b[:.)]?|\d+[.)](?=\s)|[-*](?=\s))(?P<line>.*)$"
    r"|\b(?:first|second|next|then|finally),(?P<word>[^.\n]*)",
    re.IGNORECASE,
)


def strict_format(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 for exactly `<think>R</think><answer>A</answer>` with R non-blank, A an answer (not blank nor a
    placeholder) and nothing after, else 0.0."""
    out = []
    for c in completions:
        m = _STRICT.fullmatch(completion_text(c))
        ok = (
            m is not None
            and not any(t in m["think"] or t in m["answer"] for t in TAGS)
            and m["think"].strip() != ""
            and not is_placeholder(m["answer"])
        )
        out.append(1.0 if ok else 0.0)
    return out


def _blank(content: str) -> bool:
    return not content.strip()


def _tag_score(text: str) -> float:
    once = {t: text.index(t) for t in TAGS if text.count(t) == 1}
    positions = [once[t] for t in TAGS if t in once]
    if positions != sorted(positions):  # "</answer><answer>" is not the format, whatever the counts
        return 0.0
    score = 0.25 * len(once)
    for open_tag, close_tag, empty in ((*TAGS[:2], _blank), (*TAGS[2:], is_placeholder)):
        if open_tag in once and close_tag in once and empty(text[once[open_tag] + len(open_tag) : once[close_tag]]):
            score -= 0.5  # an empty pair (an answer pair around a placeholder) shows the shape, not the work
    return score


def tag_count(completions: list[Any], **kwargs: Any) -> list[float]:
    """0.25 per format tag that occurs exactly once, in order; nothing for a pair around blank content, nor
    for an answer pair around a placeholder."""
    return [_tag_score(completion_text(c)) for c in completions]


def reasoning_steps(completions: list[Any], cap: int = 3, **kwargs: Any) -> list[float]:
    """min(number of distinct, non-empty steps, cap) / cap."""
    if cap < 1:
        raise ValueError(f"reasoning_steps: cap must be >= 1, got {cap}.")
    out = []
    for c in completions:
        steps = set()
        for m in _STEP.finditer(completion_text(c)):
            body = re.sub(r"\W+", " ", (m["line"] if m["line"] is not None else m["word"]).lower()).strip()
            if re.search(r"[^\W_]", body):
                steps.add(body)
        out.append(min(len(steps), cap) / cap)
    return out
