"""The process reward's answer checked before process supervision trains on it (algo.advantage=process).

``reward.process_function(prompts, completions, completion_ids=..., **columns)`` returns one list of
``(end_token, reward)`` steps per completion (DeepSeekMath §4.1.3). A step ends at a token of its own
completion, ``0 <= end < len(completion_ids[i])`` (an empty completion's one step at 0), and its reward
is a finite number. A step outside its completion would silently cover every token (an end past it)
or none (a negative end) while still moving the group's mean and std, and a NaN would turn the whole
group's advantages into NaN: each is refused in one sentence naming the completion and the value.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

from .errors import RewardError

FIELD = "reward.process_function"


def checked(fn: Callable[..., Any]) -> Callable[..., list[list[tuple[int, float]]]]:
    """``fn`` whose every answer goes through ``check_steps`` against the ``completion_ids`` it was given."""

    @functools.wraps(fn)
    def call(prompts, completions, *, completion_ids, **columns):
        return check_steps(fn(prompts, completions, completion_ids=completion_ids, **columns), completion_ids)

    return call


def check_steps(steps: Any, completion_ids: list[list[int]]) -> list[list[tuple[int, float]]]:
    """``steps`` as ``[(end, reward), ...]`` per completion, each within its completion and finite; else refused."""
    if not isinstance(steps, (list, tuple)) or len(steps) != len(completion_ids):
        got = f"{len(steps)} step lists" if isinstance(steps, (list, tuple)) else f"a {type(steps).__name__}"
        raise RewardError(
            f"{FIELD} returned {got} for {len(completion_ids)} completions; return one list of (end_token, "
            "reward) steps per completion"
        )
    return [
        [_step(step, i, k, len(ids)) for k, step in enumerate(seq)]
        for i, (seq, ids) in enumerate(zip(steps, completion_ids))
    ]


def _step(step: Any, i: int, k: int, n: int) -> tuple[int, float]:
    """Step ``k`` of completion ``i`` (``n`` tokens) as ``(end, reward)``."""
    try:
        end, value = step
        end_i, value_f = int(end), float(value)
        exact = end_i == end
    except (TypeError, ValueError):
        exact = False
    if not exact:
        raise RewardError(f"{FIELD} gave step {k} of completion {i} as {step!r}; a step is (end_token, reward)")
    if not 0 <= end_i < max(n, 1):
        raise RewardError(
            f"{FIELD} ended step {k} of completion {i} at token {end_i}, outside its {n} tokens; a step ends at an "
            f"index 0..{max(n, 1) - 1} of that completion's completion_ids"
        )
    if not math.isfinite(value_f):
        raise RewardError(f"{FIELD} gave step {k} of completion {i} the reward {value!r}; return finite numbers")
    return end_i, value_f
