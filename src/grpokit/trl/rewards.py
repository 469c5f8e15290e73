"""TRL's reward functions (``trl.rewards``) for scripts that import them, without TRL.

Each takes and returns what TRL's does and scores as TRL's does (tests/trl/test_trl_rewards_module.py
compares them with TRL's on a table of cases):

- ``accuracy_reward``: 1.0 when math-verify finds the gold ``solution`` equal to the completion's first
  LaTeX answer (a ``\\boxed{}`` first), else 0.0; None when the gold does not parse (the row is skipped).
- ``reasoning_accuracy_reward``: the same on what follows the reasoning delimiter (``</think>``); 0.0
  when the completion has no delimiter (unfinished reasoning).
- ``think_format_reward``: 1.0 when the completion opens with ``<think>``, opens no second one and
  closes it, else 0.0.
- ``get_soft_overlong_punishment(L_max, L_cache)``: DAPO's soft overlong punishment on the token count L:
  0 up to L_max - L_cache, then linear down to -1 at L_max, -1 beyond.
- ``get_cosine_scaled_reward(max_len, ...)``: correctness scaled by a cosine of L / max_len (Yeo et
  al. 2025): short correct answers earn most, short wrong ones lose most.
- ``get_repetition_penalty_reward(ngram_size, max_penalty)``: max_penalty times the share of repeated
  token n-grams.

Unlike grpokit's own ``math_accuracy`` (rewards/math.py: one final answer, hedges score 0, a killable
worker pool), these keep TRL's exact rules, so a TRL script's rewards do not change when it moves.
A completion may be TRL's conversational list or plain text.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def _text(completion: Any) -> str:
    return completion if isinstance(completion, str) else completion[0]["content"]


def _timeouts() -> tuple[int | None, int | None]:
    """math-verify's timeouts use signal.alarm, which works in the main thread only (as TRL: none elsewhere)."""
    main = threading.current_thread() is threading.main_thread()
    if not main:
        import logging

        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.ERROR)
    return (10, 5) if main else (None, None)


def _judge(answer: str, gold: str, parse_s: int | None, verify_s: int | None) -> tuple[float | None, str, str]:
    """(reward, gold as parsed, answer as parsed) for one completion text against its gold solution."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    gold_parsed = parse(gold, parsing_timeout=parse_s)
    if not gold_parsed:
        return None, "[unparseable]", "[skipped]"
    latex = LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True), boxed_match_priority=0, try_extract_without_anchor=False
    )  # a well-formed LaTeX answer, boxed first
    answer_parsed = parse(answer, extraction_config=[latex], extraction_mode="first_match", parsing_timeout=parse_s)
    reward = float(verify(gold_parsed, answer_parsed, timeout_seconds=verify_s))
    return reward, str(gold_parsed), str(answer_parsed) if answer_parsed else "[unparseable]"


def _log(log_extra: Callable[[str, list], None] | None, solution: list, judged: list[tuple]) -> None:
    if log_extra is not None:  # the columns TRL's trainer adds to the completions table
        log_extra("solution", list(solution))
        log_extra("gold_parsed", [j[1] for j in judged])
        log_extra("answer_parsed", [j[2] for j in judged])


def accuracy_reward(
    completions: list, solution: list[str], log_extra: Callable[[str, list], None] | None = None, **kwargs: Any
) -> list[float | None]:
    """1.0 / 0.0 per completion by math-verify against ``solution``; None where the gold does not parse."""
    parse_s, verify_s = _timeouts()
    judged = [_judge(_text(c), gold, parse_s, verify_s) for c, gold in zip(completions, solution, strict=True)]
    _log(log_extra, solution, judged)
    return [j[0] for j in judged]


def reasoning_accuracy_reward(
    completions: list,
    solution: list[str],
    reasoning_delimiters: list[str] | None = None,
    log_extra: Callable[[str, list], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """accuracy_reward on the text after the last reasoning delimiter (the first of ``reasoning_delimiters``,
    default ``["</think>"]``, that occurs); 0.0 for a completion whose reasoning never ends."""
    delimiters = [_THINK_CLOSE] if reasoning_delimiters is None else reasoning_delimiters
    parse_s, verify_s = _timeouts()
    judged = []
    for c, gold in zip(completions, solution, strict=True):
        text = _text(c)
        found = next((d for d in delimiters if d in text), None)
        if found is None:
            judged.append((0.0, "[incomplete reasoning]", "[incomplete reasoning]"))
        else:
            judged.append(_judge(text.rsplit(found, 1)[1], gold, parse_s, verify_s))
    _log(log_extra, solution, judged)
    return [j[0] for j in judged]


def think_format_reward(completions: list, **kwargs: Any) -> list[float]:
    """1.0 when the completion starts with <think>, has no second <think>, and closes it with </think>."""

    def ok(text: str) -> bool:
        rest = text[len(_THINK_OPEN) :]
        return text.startswith(_THINK_OPEN) and _THINK_OPEN not in rest and _THINK_CLOSE in rest

    return [1.0 if ok(_text(c)) else 0.0 for c in completions]


class _SoftOverlong:
    """A class, not a closure, so the reward pickles into worker processes; its name keys the metrics."""

    __name__ = "soft_overlong_punishment_reward"

    def __init__(self, max_completion_len: int, soft_punish_cache: int):
        self.max_completion_len, self.soft_punish_cache = max_completion_len, soft_punish_cache

    def __call__(self, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        safe = self.max_completion_len - self.soft_punish_cache  # DAPO eq. 13: free up to L_max - L_cache
        out = []
        for ids in completion_ids:
            n = len(ids)
            out.append(
                0.0 if n <= safe else -1.0 if n > self.max_completion_len else (safe - n) / self.soft_punish_cache
            )
        return out


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> Callable:
    """DAPO's soft overlong punishment of a completion's token count (``completion_ids``)."""
    return _SoftOverlong(max_completion_len, soft_punish_cache)


class _CosineScaled:
    __name__ = "cosine_scaled_reward"

    def __init__(
        self,
        max_len: int,
        min_value_wrong: float,
        max_value_wrong: float,
        min_value_correct: float,
        max_value_correct: float,
    ):
        self.max_len = max_len
        self.wrong = (max_value_wrong, min_value_wrong)  # (value at max_len, value at length 0)
        self.correct = (min_value_correct, max_value_correct)

    def __call__(
        self, completions: list, solution: list[str], completion_ids: list[list[int]], **kwargs: Any
    ) -> list[float | None]:
        out: list[float | None] = []
        for right, ids in zip(accuracy_reward(completions, solution), completion_ids, strict=True):
            if right is None:
                out.append(None)
                continue
            at_end, at_start = self.correct if right else self.wrong
            c = math.cos(min(len(ids) / self.max_len, 1.0) * math.pi)  # 1 at length 0, -1 from max_len on
            out.append(float(at_end + 0.5 * (at_start - at_end) * (1.0 + c)))
        return out


def get_cosine_scaled_reward(
    max_len: int,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
) -> Callable:
    """Correctness (as accuracy_reward) scaled by length: correct answers from max_value_correct (empty) down to
    min_value_correct (max_len tokens or more); wrong ones from min_value_wrong up to max_value_wrong."""
    return _CosineScaled(max_len, min_value_wrong, max_value_wrong, min_value_correct, max_value_correct)


class _Repetition:
    __name__ = "repetition_penalty_reward"

    def __init__(self, ngram_size: int, max_penalty: float):
        self.ngram_size, self.max_penalty = ngram_size, max_penalty

    def __call__(self, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        n, out = self.ngram_size, []
        for ids in completion_ids:
            grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
            repeated = 1 - len(set(grams)) / len(grams) if grams else 0.0
            out.append(repeated * self.max_penalty if repeated else 0.0)
        return out


def get_repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> Callable:
    """max_penalty * (1 - unique / total) over the completion's token n-grams; 0.0 below n tokens."""
    if max_penalty > 0:
        raise ValueError(f"max_penalty must be <= 0 (a penalty), got {max_penalty}")
    return _Repetition(ngram_size, max_penalty)


__all__ = [
    "accuracy_reward",
    "get_cosine_scaled_reward",
    "get_repetition_penalty_reward",
    "get_soft_overlong_punishment",
    "reasoning_accuracy_reward",
    "think_format_reward",
]
