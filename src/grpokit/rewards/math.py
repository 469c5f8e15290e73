"""Math accuracy with math-verify, in killable worker processes.

Reward (per completion): 1.0 if `math_verify.verify(gold, prediction)` holds, else 0.0; None (not
applicable) when the row has no gold answer or the gold does not parse. The argument order matters:
math-verify treats the first argument as the reference (gold) and the second as the model's answer.

Why a pool: sympy can spend minutes (or all memory) on an innocent-looking answer such as the power tower
9^9^9^9^9, and math-verify's own signal-based timeout cannot interrupt a long computation inside C code.
Every parse+verify therefore runs in a `WorkerPool` process with a hard per-item timeout: when it passes,
the worker is killed, replaced, and the item scores 0.0. math-verify's internal timeouts are switched off
so that the hard timeout is the single rule.

Gold answers are checked once, when the data loads, with `validate_gold_answers`: a gold that does not
parse is reported (index, text, reason) rather than silently scoring every completion 0.
"""
from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from grpokit.rewards.pool import WorkerPool

log = logging.getLogger("grpokit.rewards")

DEFAULT_TIMEOUT_S = 3.0
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or TRL's conversational form [{"role": ..., "content": ...}]."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def _as_math(text: str) -> str:
    """Give math-verify something it can anchor on: wrap a bare answer (no $ or \\boxed) in $...$."""
    text = text.strip()
    if "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text:
        return text
    return f"${text}$"


# -- work done inside pool processes (module level, so it pickles by reference) ---------------------
def _quiet() -> None:
    # math-verify warns on every call that its own timeouts are off; the hard pool timeout replaces them.
    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _parse_gold(gold: str) -> tuple[bool, str]:
    from math_verify import parse

    _quiet()
    parsed = parse(_as_math(gold), extraction_mode="first_match", parsing_timeout=None)  # type: ignore[arg-type]
    return (bool(parsed), "" if parsed else "math-verify found no answer in it")


def _verify_one(gold: str, prediction: str) -> float | None:
    from math_verify import parse, verify

    _quiet()
    gold_parsed = parse(_as_math(gold), extraction_mode="first_match", parsing_timeout=None)  # type: ignore[arg-type]
    if not gold_parsed:
        return None
    tagged = _ANSWER_TAG.findall(prediction)
    text = _as_math(tagged[-1]) if tagged else prediction
    pred_parsed = parse(text, parsing_timeout=None)  # type: ignore[arg-type]
    if not pred_parsed:
        return 0.0
    return 1.0 if verify(gold_parsed, pred_parsed, timeout_seconds=None) else 0.0  # gold first


class MathVerifyPool:
    """Parse and verify in `num_workers` killable processes with a hard per-item `timeout_s`."""

    def __init__(self, num_workers: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.pool = WorkerPool(num_workers)
        self.timeout_s = timeout_s
        self.timeouts = 0  # items cut off so far

    def verify(self, golds: Sequence[str], predictions: Sequence[str]) -> list[float | None]:
        """1.0 / 0.0 per (gold, prediction) pair; None when the gold does not parse; 0.0 on timeout."""
        tasks = [(_verify_one, (str(g), completion_text(p)), {}) for g, p in zip(golds, predictions)]
        scores: list[float | None] = []
        for outcome in self.pool.run(tasks, self.timeout_s):
            if outcome.ok:
                scores.append(outcome.value)
            else:
                self.timeouts += outcome.timed_out
                log.warning("math verification failed (%s); scoring 0.0", outcome.error)
                scores.append(0.0)
        return scores

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "MathVerifyPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default: MathVerifyPool | None = None
_default_lock = threading.Lock()


def default_pool() -> MathVerifyPool:
    """The process-wide pool used by `math_accuracy` (one worker, created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MathVerifyPool()
        return _default


def gold_column(kwargs: dict[str, Any]) -> list[Any] | None:
    """The gold answers of a batch: the `answer` column, else `solution` (TRL's name)."""
    for key in ("answer", "solution"):
        if kwargs.get(key) is not None:
            return list(kwargs[key])
    return None


def correctness(completions: list[Any], kwargs: dict[str, Any]) -> list[float | None]:
    """Per completion 1.0/0.0 from a boolean `correct` column if given, else math-verify on the gold."""
    if kwargs.get("correct") is not None:
        return [None if c is None else float(bool(c)) for c in kwargs["correct"]]
    golds = gold_column(kwargs)
    if golds is None:
        return [None] * len(completions)
    scores = default_pool().verify([("" if g is None else g) for g in golds], completions)
    return [None if g is None else s for g, s in zip(golds, scores)]


def math_accuracy(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion's final answer equals the gold (`answer` or `solution` column), else 0.0.

    The prediction is the last <answer>...</answer> if present, else what math-verify extracts from the
    whole completion (last \\boxed{}, "the answer is ...", ...). None when the row has no usable gold.
    """
    golds = gold_column(kwargs)
    if golds is None:
        raise ValueError("math_accuracy needs an 'answer' (or 'solution') column with the gold answers.")
    return correctness(completions, {"answer": golds})


@dataclass
class GoldReport:
    """Result of `validate_gold_answers`: which gold answers math-verify could not parse."""

    num_total: int
    invalid: list[tuple[int, str, str]] = field(default_factory=list)  # (index, gold text, reason)

    @property
    def ok(self) -> bool:
        return not self.invalid

    @property
    def num_valid(self) -> int:
        return self.num_total - len(self.invalid)

    def message(self, max_shown: int = 5) -> str:
        if self.ok:
            return f"All {self.num_total} gold answers parse."
        shown = "; ".join(f"#{i} {text[:60]!r} ({why})" for i, text, why in self.invalid[:max_shown])
        return f"{len(self.invalid)} of {self.num_total} gold answers do not parse and will be skipped: {shown}"


def validate_gold_answers(answers: Sequence[Any], timeout_s: float = DEFAULT_TIMEOUT_S,
                          num_workers: int = 1) -> GoldReport:
    """Parse every gold answer once at data-load time (in killable workers) and report the bad ones."""
    report = GoldReport(num_total=len(answers))
    with WorkerPool(num_workers) as pool:
        tasks = [(_parse_gold, (str(a),), {}) for a in answers]
        for i, (answer, outcome) in enumerate(zip(answers, pool.run(tasks, timeout_s))):
            if answer is None or str(answer).strip() == "":
                report.invalid.append((i, "" if answer is None else str(answer), "empty"))
            elif not outcome.ok:
                report.invalid.append((i, str(answer), outcome.error or "failed"))
            elif not outcome.value[0]:
                report.invalid.append((i, str(answer), outcome.value[1]))
    return report
