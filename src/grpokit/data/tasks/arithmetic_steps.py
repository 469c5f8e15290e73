"""A process reward for the arithmetic task: one step per answer digit (for process supervision).

Completion tokens after ``<answer>`` are the digits of the answer; digit k is a step ending at its
own token and earns 1.0 when it equals digit k of the gold answer (aligned from the left), else 0.0.
The closing ``</answer>`` is a final step worth 1.0 when the whole answer is exact. A completion
without an answer tag is one step on its last token worth 0.0. This is the ``(end token, reward)``
list format of ``grpokit.rewards.models.ProcessRewardFunction``; the trainer turns it into
per-token advantages (DeepSeekMath process supervision).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .chartok import TAG_TOKENS, build_char_tokenizer

OPEN, CLOSE = TAG_TOKENS


@lru_cache(maxsize=1)
def _tokenizer():
    return build_char_tokenizer()


def digit_steps(
    prompts: list[str], completions: list[Any], completion_ids: list[list[int]], answer: list[str], **kwargs: Any
) -> list[list[tuple[int, float]]]:
    tok = _tokenizer()
    out = []
    for ids, gold in zip(completion_ids, answer):
        tokens = tok.convert_ids_to_tokens(list(ids))
        gold = str(gold)
        steps: list[tuple[int, float]] = []
        if OPEN in tokens:
            start = tokens.index(OPEN) + 1
            digits = []
            for t in range(start, len(tokens)):
                if tokens[t] == CLOSE:
                    steps.append((t, 1.0 if "".join(digits) == gold else 0.0))
                    break
                k = len(digits)
                digits.append(tokens[t])
                steps.append((t, 1.0 if k < len(gold) and tokens[t] == gold[k] else 0.0))
        if not steps:
            steps = [(max(0, len(ids) - 1), 0.0)]
        out.append(steps)
    return out


def digit_accuracy(
    prompts: list[str], completions: list[Any], completion_ids: list[list[int]], answer: list[str], **kwargs: Any
) -> list[float]:
    """Partial credit: the fraction of answer digits that match the gold answer (0.0 without tags).

    A second, denser objective for multi-objective runs: ``digit_steps`` without the final step.
    """
    out = []
    for steps, gold in zip(digit_steps(prompts, completions, completion_ids, answer), answer):
        digit_rewards = [r for _, r in steps[:-1]] if len(steps) > 1 else []
        out.append(sum(digit_rewards) / max(len(str(gold)), len(digit_rewards)) if digit_rewards else 0.0)
    return out
