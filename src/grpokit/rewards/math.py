"""Math accuracy with math-verify, in killable worker processes.

Reward (per completion): 1.0 if `math_verify.verify(gold, prediction)` holds, else 0.0; None (not
applicable) when the row has no gold answer or the gold does not parse. The argument order matters:
math-verify treats the first argument as the reference (gold) and the second as the model's answer.
The prediction is the completion's one final answer (grpokit.rewards.answers): a hedge, several
candidates that disagree or more values than the gold has, scores 0.0; a blank or placeholder box or
tag ("put it in \\boxed{}", "<answer> answer here </answer>") is no candidate. Thousands separators
(1,000 and 1\\,000) are removed before parsing, in gold and prediction alike.

Why a pool: sympy can spend minutes (or all memory) on an innocent-looking answer such as the power tower
9^9^9^9^9, and math-verify's own signal-based timeout cannot interrupt a long computation inside C code.
Every parse+verify therefore runs in a `WorkerPool` process with a hard per-item budget of CPU seconds
(the item's own work: a loaded machine stretches its wall time, not its budget); when it is spent, the
worker is killed and replaced. math-verify's internal (signal-based) timeouts are switched off so that
this budget is the single rule. Workers are warmed (`warm_up`) before their first item, outside its
budget, and one spare is kept warm, so a killed worker's place is taken at once.

No escape from zero: whatever the answer itself causes scores 0.0, as a wrong answer does, and is
reported by kind to the runner (grpokit.rewards.calls.report_fault): ``limits`` (too big to check,
grpokit.rewards.answer_limits, decided from the text in microseconds), ``timeouts`` (its budget spent),
``crashes`` (the verifier raised on it, or its worker died on it twice). Only the machine's failure
(no worker began the item within the start-up budget, twice) is no score: None, counted ``machine``.

Gold answers are checked once, when the data loads, with `validate_gold_answers`: a gold that does not
parse is reported (index, text, reason) rather than silently scoring every completion 0.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from grpokit.version import installed, older_than

from .answer_limits import over_limit
from .answers import (
    FinalAnswer,
    count_values,
    drop_echoed_lines,
    final_answer,
    normalize_number_text,
    without_placeholders,
)
from .calls import MACHINE, report_fault, startup, timed_elsewhere
from .errors import RewardInfrastructureError
from .inputs import model_answer
from .pool import WorkerPool

log = logging.getLogger("grpokit.rewards")

DEFAULT_TIMEOUT_S = 3.0
MAX_CANDIDATES = 8  # more distinct candidate answers than this is a hedge without checking each


def completion_text(completion: Any) -> str:
    """The text the built-in rewards grade: a string as it is; for TRL's conversational form (a list of
    {"role": ..., "content": ...} messages, a whole episode's conversation too) the model's own answer, the
    content of the last message when it is the model's (rewards/inputs.py model_answer), and "" (no answer,
    which scores as one) when the conversation ends on a tool's message or on a turn that called a tool."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return model_answer(completion) or ""
    return str(completion)


def prompt_text(prompt: Any) -> str | None:
    """The text of a prompt: a string, or every message's content of a conversational prompt."""
    if prompt is None or isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in prompt)
    return str(prompt)


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


def _parse(text: str, **kw: Any) -> list[Any]:
    try:
        from math_verify import parse
    except ImportError as exc:  # in a worker: fatal for the whole run, not a 0.0 for this item
        raise RewardInfrastructureError(f"math-verify could not be imported in a worker process ({exc}).") from None
    problem = math_verify_version_problem()
    if problem:  # fatal too: an older math-verify fails every item or grades some differently
        raise RewardInfrastructureError(problem)
    _quiet()
    return parse(normalize_number_text(text), parsing_timeout=None, **kw)  # type: ignore[arg-type]


MIN_MATH_VERIFY = "0.9"  # pyproject.toml's floor: what the tests' grading tables were run with


@functools.cache
def math_verify_version_problem() -> str:
    """What is wrong with the installed math-verify's version ("" when nothing is, or it has no metadata).
    Under 0.7 every call fails (``parsing_timeout=None``, which switches its signal timeouts off, is
    0.8's); under 0.8 a percentage gold no longer equals the bare number (tests/rewards/test_rewards_exploits.py)."""
    v = installed("math-verify")
    if v is None or not older_than(v, MIN_MATH_VERIFY):
        return ""
    return (
        f"math-verify {v} is installed, and grpokit's math rewards need math-verify >= 0.9 (0.7 fails on "
        "every answer, 0.8 grades some differently): pip install 'math-verify>=0.9'"
    )


def _gold(gold: str) -> list:
    """math-verify's parse of a gold answer, or [] when it holds no mathematical value: "???" or "-" parse
    to their text alone, which no answer but the same punctuation could match, so such a gold is not one."""
    parsed = _parse(_as_math(gold), extraction_mode="first_match")
    return parsed if any(not isinstance(p, str) for p in parsed) else []


def _parse_gold(gold: str) -> tuple[bool, str]:
    parsed = _gold(gold)
    return (bool(parsed), "" if parsed else "math-verify found no mathematical value in it")


def warm_up() -> None:
    """Run once in each worker before its first item: the imports and math-verify's parser set-up
    (seconds on a loaded machine: 9.7 s were measured) happen here, not inside an item's deadline.
    A failure is left for the items to report (an import error is then RewardInfrastructureError)."""
    try:
        _verify_one("1/2", r"so \boxed{\frac{1}{2}}", None)
        _verify_one("x", "<answer>x</answer>", None)
    except Exception:  # noqa: BLE001 - the real calls raise it again, with the right type
        pass


def _same(a: list[Any], b: list[Any]) -> bool:
    from math_verify import verify

    return bool(a) and bool(b) and verify(a, b, timeout_seconds=None)


class AnswerOverLimit(ValueError):
    """The final answer is too big to check (grpokit.rewards.answer_limits): it scores 0, as ``limits``."""


def prediction_text(found: FinalAnswer) -> str:
    """What math-verify parses for a final answer: a tag's content is a bare answer ("1/2"), a box is re-boxed;
    phrases and lines go as written, so that its own extraction finds the number in "so it is 42 apples"."""
    text = found.text or ""
    return {"answer_tag": _as_math(text), "boxed": f"$\\boxed{{{text}}}$"}.get(found.kind, text)


def _verify_item(gold: str, prediction: str, prompt: str | None, allow_multiple: bool) -> tuple[float | None, str]:
    """(score, why it is over a limit or ""): `_verify_one` in a pool worker."""
    try:
        return _verify_one(gold, prediction, prompt, allow_multiple), ""
    except AnswerOverLimit as exc:
        return 0.0, str(exc)


def _verify_one(gold: str, prediction: str, prompt: str | None = None, allow_multiple: bool = False) -> float | None:
    """1.0 / 0.0 for one completion; None when the gold does not parse. Runs in a pool worker."""
    gold_parsed = _gold(gold)
    if not gold_parsed:
        return None
    found = final_answer(prediction, prompt)
    if found.text is None:
        return 0.0
    too_big = over_limit(found.text) or next(filter(None, map(over_limit, found.others)), None)
    if too_big:
        raise AnswerOverLimit(too_big)
    if allow_multiple and found.kind != "answer_tag":  # a set gold: let math-verify gather every box
        found = FinalAnswer(without_placeholders(drop_echoed_lines(prediction, prompt)), "text")
    pred_parsed = _parse(prediction_text(found))
    if not pred_parsed:
        return 0.0
    if not allow_multiple:  # the one-answer rule (grpokit.rewards.answers): a hedge earns nothing
        if count_values(found.text) > max(1, count_values(gold)):
            return 0.0
        others = found.others  # several tags / boxes / "answer is" that read differently must agree
        if len(others) > MAX_CANDIDATES or not all(_same(_parse(_as_math(c)), pred_parsed) for c in others):
            return 0.0
    return 1.0 if _same(gold_parsed, pred_parsed) else 0.0  # gold first: math-verify's reference


def require_math_verify() -> None:
    """Raise RewardInfrastructureError (one sentence with the fix) when math-verify cannot be imported."""
    try:
        import math_verify  # noqa: F401
    except ImportError as exc:
        raise RewardInfrastructureError(
            f"math-verify could not be imported ({exc}), so math rewards cannot be computed: install it "
            "with `pip install 'math-verify[antlr4_13_2]'`."
        ) from None


class MathVerifyPool:
    """Parse and verify in `num_workers` killable processes with a hard per-item `timeout_s`.

    Safe to share between threads (see WorkerPool). ``timeout_s`` is CPU seconds per item. What an
    answer causes (too big, out of budget, crashing the verifier) scores 0.0 and is reported by kind
    (module docstring) and counted here in `timeouts` / `errors` / `limits`; a broken pool or verifier
    raises RewardInfrastructureError. Each worker is warmed before it takes items (``warm_up``:
    math-verify and sympy imported, the LaTeX parser built), as start-up
    (``grpokit.rewards.calls.startup``, within ``START_TIMEOUT_S``), so a cold start never eats the
    first answers' ``timeout_s`` nor the deadline of the reward call that uses the pool.
    """

    def __init__(self, num_workers: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        with startup():  # the import and the pool's spawn and warm-up: not the calling reward's deadline
            require_math_verify()  # fail here, in one sentence, not with one 0.0 per item in the workers
            self.pool = WorkerPool(num_workers, name="math-verify", initializer=warm_up, cpu_budget=True, spares=1)
        self.timeout_s = timeout_s
        self.timeouts = 0  # items cut off so far
        self.errors = 0  # items whose parse or verify raised (or whose worker died on them twice)
        self.limits = 0  # items too big to check
        self._count_lock = threading.Lock()

    def verify(
        self,
        golds: Sequence[str],
        predictions: Sequence[str],
        prompts: Sequence[Any] | None = None,
        allow_multiple: bool = False,
    ) -> list[float | None]:
        """1.0 / 0.0 per (gold, prediction) pair; None when the gold does not parse, or when the machine
        failed on the item (no worker began it, twice). What the answer causes is 0.0 and reported by kind
        to the calling reward (``report_fault``, with the pair's position), never an exclusion.

        `prompts` (one per pair) lets lines copied from the prompt be ignored; `allow_multiple` turns
        off the one-answer rule (see `grpokit.rewards.answers`).
        """
        prompts = [None] * len(golds) if prompts is None else prompts
        tasks = [
            (_verify_item, (str(g), completion_text(p), prompt_text(q), allow_multiple), {})
            for g, p, q in zip(golds, predictions, prompts)
        ]
        with timed_elsewhere():  # each answer holds its own budget: not the calling reward's deadline
            outcomes = self.pool.run(tasks, self.timeout_s)
        return [self._score(i, outcome) for i, outcome in enumerate(outcomes)]

    def _score(self, i: int, outcome: Any) -> float | None:
        if outcome.fatal:
            raise RewardInfrastructureError(f"math verification cannot run: {outcome.error}")
        if outcome.ok:
            score, too_big = outcome.value
            if too_big:
                self._count("limits")
                report_fault(i, "limits", too_big)
            return score
        if outcome.kind == MACHINE:  # nobody's answer: no score, counted by the runner
            report_fault(i, MACHINE, f"math verification could not run ({outcome.error})")
            return None
        kind = "timeouts" if outcome.timed_out else "crashes"
        self._count("timeouts" if outcome.timed_out else "errors")
        what = f"spent its {self.timeout_s:g} CPU-second budget" if outcome.timed_out else f"failed ({outcome.error})"
        report_fault(i, kind, f"math verification of this answer {what}")
        return 0.0

    def _count(self, what: str) -> None:
        with self._count_lock:
            setattr(self, what, getattr(self, what) + 1)

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
            _default = MathVerifyPool()  # its start-up stops the calling reward's deadline (calls.startup)
        return _default


def gold_column(kwargs: dict[str, Any]) -> list[Any] | None:
    """The gold answers of a batch: the `answer` column, else `solution` (TRL's name)."""
    for key in ("answer", "solution"):
        if kwargs.get(key) is not None:
            return list(kwargs[key])
    return None


def correctness(completions: list[Any], kwargs: dict[str, Any]) -> list[float | None]:
    """Per completion 1.0/0.0 from a boolean `correct` column if given, else math-verify on the gold.

    Reads `prompts` (echoed prompt lines are ignored) and `allow_multiple` from `kwargs` when present.
    """
    if kwargs.get("correct") is not None:
        return [None if c is None else float(bool(c)) for c in kwargs["correct"]]
    golds = gold_column(kwargs)
    if golds is None:
        return [None] * len(completions)
    scores = default_pool().verify(
        [("" if g is None else g) for g in golds],
        completions,
        prompts=kwargs.get("prompts"),
        allow_multiple=bool(kwargs.get("allow_multiple")),
    )
    return [None if g is None else s for g, s in zip(golds, scores)]


def math_accuracy(
    completions: list[Any], prompts: list[Any] | None = None, allow_multiple: bool = False, **kwargs: Any
) -> list[float | None]:
    """1.0 when the completion's one final answer equals the gold (`answer` or `solution` column), else 0.0.

    The final answer is the last <answer>...</answer>, else the last \\boxed{}, else the last "answer
    is ...", else the last line (grpokit.rewards.answers); lines copied from `prompts` are ignored. A
    hedge (candidates that disagree, or more values than the gold has) scores 0.0 unless
    `allow_multiple=True` (for tasks whose gold is itself a set). None when the row has no usable gold.
    """
    golds = gold_column(kwargs)
    if golds is None:
        raise ValueError("math_accuracy needs an 'answer' (or 'solution') column with the gold answers.")
    return correctness(completions, {"answer": golds, "prompts": prompts, "allow_multiple": allow_multiple})


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


def validate_gold_answers(
    answers: Sequence[Any], timeout_s: float = DEFAULT_TIMEOUT_S, num_workers: int = 1
) -> GoldReport:
    """Parse every gold answer once at data-load time (in killable workers) and report the bad ones. A gold
    that could not be checked at all (no worker began it: the machine's failure, or math-verify broken)
    raises RewardInfrastructureError instead of being reported invalid."""
    report = GoldReport(num_total=len(answers))
    with startup():  # warmed like MathVerifyPool's workers: a cold import is not a gold's deadline
        pool = WorkerPool(num_workers, name="math-verify", initializer=warm_up, cpu_budget=True)
    with pool:
        tasks = [(_parse_gold, (str(a),), {}) for a in answers]
        for i, (answer, outcome) in enumerate(zip(answers, pool.run(tasks, timeout_s))):
            if outcome.fatal or outcome.kind == MACHINE:  # nobody's gold: the check itself could not run
                fix = "rerun when the machine is less loaded" if outcome.kind == MACHINE else "fix the install"
                raise RewardInfrastructureError(
                    f"gold answer {i} ({str(answer)[:60]!r}) could not be checked: {outcome.error}; the run stops "
                    f"rather than call a gold nobody judged invalid ({fix})"
                )
            if answer is None or str(answer).strip() == "":
                report.invalid.append((i, "" if answer is None else str(answer), "empty"))
            elif not outcome.ok:
                report.invalid.append((i, str(answer), outcome.error or "failed"))
            elif not outcome.value[0]:
                report.invalid.append((i, str(answer), outcome.value[1]))
    return report
