"""The built-in verifiable task: two-digit addition with the answer in tags.

One problem is a pair of operands ``(a, b)`` with ``10 <= a, b <= 99``. The model sees the prompt
``"57+68="`` and should complete it with ``"<answer>125</answer>"`` followed by its end-of-sequence
token. The reward is binary and needs no model: 1.0 when the text inside the first answer tags is
exactly the decimal sum, else 0.0.

Splits are disjoint by construction, not by sampling luck. Every pair is assigned once and for all
by a stable hash of its prompt text::

    held_out(a, b)  <=>  crc32("a+b=") mod HOLD_OUT_MODULUS == 0

so roughly 1/10 of the 90 * 90 = 8100 pairs (822 of them) form the held-out split and the
training generator only ever draws from the complement. crc32 (unlike Python's ``hash``) is the
same on every machine and every run, and it does not correlate with the digits, so both splits
contain carries in the same proportion (a rule such as ``(7a + b) mod 10`` would select whole
families of unit digits and bias the held-out set).

Rows follow the trainer's dataset format: ``{"prompt": str, "answer": str}``; the reward function
follows TRL's convention ``reward(prompts, completions, answer, **kwargs) -> list[float]`` where
``answer`` is the dataset column, one gold answer per completion.
"""

from __future__ import annotations

import random
import re
import zlib
from functools import lru_cache
from typing import Any, Sequence

from grpokit.rewards.math import completion_text

OPERAND_MIN = 10
"""Smallest operand (inclusive): operands always have two digits, so every prompt is 6 characters."""
OPERAND_MAX = 99
"""Largest operand (inclusive)."""
HOLD_OUT_MODULUS = 10
"""A pair is held out when ``crc32(prompt) % HOLD_OUT_MODULUS == 0`` (about 10% of the pairs)."""
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.DOTALL)


def format_prompt(a: int, b: int) -> str:
    """The prompt for ``a + b``: ``format_prompt(57, 68) == "57+68="``."""
    return f"{a}+{b}="


def format_completion(answer: int | str) -> str:
    """The ideal completion text (without EOS): ``format_completion(125) == "<answer>125</answer>"``."""
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def is_held_out(a: int, b: int) -> bool:
    """True when the pair ``(a, b)`` belongs to the held-out split (see the module docstring)."""
    return zlib.crc32(format_prompt(a, b).encode("ascii")) % HOLD_OUT_MODULUS == 0


def split_operand_pairs(lo: int, hi: int, held_out) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    """Every pair (a, b) with lo <= a, b <= hi, partitioned by ``held_out(a, b)`` into (train,
    held_out), each in lexicographic order. Shared by the built-in two-operand tasks."""
    train: list[tuple[int, int]] = []
    held: list[tuple[int, int]] = []
    for a in range(lo, hi + 1):
        for b in range(lo, hi + 1):
            (held if held_out(a, b) else train).append((a, b))
    return tuple(train), tuple(held)


@lru_cache(maxsize=None)
def _split_pairs() -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    """All operand pairs partitioned into (train, held_out), each in lexicographic order."""
    return split_operand_pairs(OPERAND_MIN, OPERAND_MAX, is_held_out)


def train_pairs() -> tuple[tuple[int, int], ...]:
    """Every operand pair the trainer may see (7278 pairs)."""
    return _split_pairs()[0]


def held_out_pairs() -> tuple[tuple[int, int], ...]:
    """Every operand pair reserved for evaluation (822 pairs), never produced by ``train_rows``."""
    return _split_pairs()[1]


def make_row(a: int, b: int) -> dict[str, str]:
    """One dataset row: ``make_row(57, 68) == {"prompt": "57+68=", "answer": "125"}``."""
    return {"prompt": format_prompt(a, b), "answer": str(a + b)}


def train_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` training rows drawn uniformly with replacement from the training pairs.

    Deterministic: the same ``(n, seed)`` always gives the same list, and a longer list starts
    with the shorter one (rows are drawn one by one from ``random.Random(seed)``).
    """
    return drawn_rows(train_pairs(), make_row, n, seed)


def held_out_rows(n: int | None = None, seed: int = 1234) -> list[dict[str, str]]:
    """The first ``n`` held-out rows (all 822 when ``n`` is None) in a fixed shuffled order.

    The shuffle makes any prefix a fair sample (carries and operand sizes in the usual
    proportions), so ``held_out_rows(200)`` is a valid small evaluation set.
    """
    return shuffled_rows(held_out_pairs(), make_row, n, seed)


def drawn_rows(pairs: Sequence[tuple[int, int]], make_row, n: int, seed: int) -> list[dict[str, str]]:
    """``n`` rows ``make_row(a, b)`` of pairs drawn with replacement, one by one from ``random.Random(seed)``
    (the train split of a built-in task)."""
    if n < 0:
        raise ValueError(f"train_rows: n must be >= 0, got {n}")
    rng = random.Random(seed)
    return [make_row(*pairs[rng.randrange(len(pairs))]) for _ in range(n)]


def shuffled_rows(pairs: Sequence[tuple[int, int]], make_row, n: int | None, seed: int) -> list[dict[str, str]]:
    """The first ``n`` rows (all when None) of the pairs in a fixed shuffled order (a held-out split)."""
    pairs = list(pairs)
    random.Random(seed).shuffle(pairs)
    if n is not None:
        if not 0 <= n <= len(pairs):
            raise ValueError(f"held_out_rows: n must be in [0, {len(pairs)}], got {n}")
        pairs = pairs[:n]
    return [make_row(a, b) for a, b in pairs]


def extract_answer(text: str) -> str | None:
    """The stripped text inside the first ``<answer>...</answer>`` pair, or None if there is none.

    Text before or after the tags is ignored (``"x<answer> 12 </answer>y"`` gives ``"12"``); an
    opening tag without a closing one gives None.
    """
    match = _ANSWER_RE.search(text)
    return None if match is None else match.group(1).strip()


def arithmetic_accuracy(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[str], **kwargs: Any
) -> list[float]:
    """Binary correctness reward, one float per completion (TRL reward-function convention).

    ``r_i = 1.0`` if ``extract_answer(completions[i]) == answer[i]`` as strings, else ``0.0``.
    The comparison is exact: ``"0125"`` or ``"125.0"`` score 0, because the task asks for the
    canonical decimal form. ``prompts`` and extra dataset columns (``kwargs``) are accepted and
    ignored. ``answer`` must have one entry per completion (the trainer repeats each row's gold
    answer G times).
    """
    if len(answer) != len(completions):
        raise ValueError(
            f"arithmetic_accuracy: got {len(completions)} completions but {len(answer)} answers; "
            "pass one gold answer per completion"
        )
    rewards: list[float] = []
    for completion, gold in zip(completions, answer):
        predicted = extract_answer(completion_text(completion))
        rewards.append(1.0 if predicted is not None and predicted == str(gold).strip() else 0.0)
    return rewards
