"""One key per value that math-verify reads from a final answer: equal keys are one answer.

``grpokit eval``'s maj@k pools the final answers math_accuracy read (grpokit.rewards.answers.final_answer)
by value, so that 0.5, 1/2, \\dfrac12 and \\frac{1}{2} are one vote, as they are one answer to the grader.
Comparing every pair of answers with math-verify would cost a verifier call per pair (n^2 / 2 per prompt);
a key costs one parse per distinct answer, in the same killable workers as the grading (MathVerifyPool):

- the answer is parsed as math_accuracy parses it (``prediction_text``: a tag's content bare, a box
  re-boxed, a phrase or last line as written), so the key starts from the grader's own normalisation
  (math-verify already reads 0.5, 1/2 and \\dfrac12 as the rational 1/2);
- a number is keyed by its value: an integer exactly, any other number rounded to 6 decimal places, which
  is math-verify's rounding of floats (so \\sqrt{2}/2 and 0.707107 are one key, as they are one answer to
  it; 50\\% is 0.5);
- an assignment ``x = 3`` is keyed by its right side (math-verify compares ``x = 3`` and ``3`` equal);
- anything else (a formula, a set, an interval, a matrix) by sympy's canonical form of its simplified
  parse: ``2(x+1)`` and ``2x+2`` are one key, the elements of a set are ordered;
- an answer math-verify finds no value in, one too big to check (answer_limits), or one whose parse
  fails or spends its budget is keyed by its text, loosely normalised (answers.text_key).

A key can be finer than math-verify's equality (two equal formulas that sympy simplifies apart) or coarser
(two exact numbers that agree to 6 decimal places); it is never a whole completion.
"""

from __future__ import annotations

from typing import Any, Sequence

from .answer_limits import over_limit
from .answers import FinalAnswer, text_key
from .errors import RewardInfrastructureError
from .math import MathVerifyPool, _parse, default_pool, prediction_text

DECIMALS = 6  # math-verify's float_rounding: floats that agree to this many decimal places are equal


def _rounded(x: float) -> str:
    x = round(x, DECIMALS) + 0.0  # + 0.0: -0.0 is 0
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _number_key(value: Any) -> str | None:
    """The key of a number (a sympy expression without free symbols), None for anything else."""
    import sympy

    if not isinstance(value, sympy.Expr) or not value.is_number:
        return None
    try:
        if value.is_integer:  # exactly, however large (answer_limits bounds the digits)
            return f"number {int(value)}"
        z = complex(sympy.N(value, 15))
    except (TypeError, ValueError, OverflowError):  # oo, zoo, nan: not a finite number
        return None
    return f"number {_rounded(z.real)}" + (f" {_rounded(z.imag)}i" if round(z.imag, DECIMALS) else "")


def value_key(value: Any) -> str:
    """The key of one of math-verify's parsed values (a sympy object); see the module docstring."""
    import sympy

    if isinstance(value, sympy.Eq) and isinstance(value.lhs, sympy.Symbol):  # x = 3: the value is 3
        value = value.rhs
    key = _number_key(value)
    if key is None:
        try:
            value = sympy.simplify(value)
        except Exception:  # noqa: BLE001 - sympy may raise anything on a strange parse; the form as parsed then
            pass
        key = _number_key(value)  # a percentage parses to a product that simplify makes a number
    return key or f"sympy {sympy.srepr(value)}"


def _answer_key(text: str, kind: str) -> str:
    """The key of one final answer, "" when it has to be keyed by its text. Runs in a pool worker."""
    if over_limit(text):
        return ""
    parsed = _parse(prediction_text(FinalAnswer(text, kind)))
    value = next((p for p in parsed if not isinstance(p, str)), None)
    return "" if value is None else value_key(value)


def answer_keys(answers: Sequence[FinalAnswer], pool: MathVerifyPool | None = None) -> list[str | None]:
    """One key per final answer (None for an answer of kind "none"), each distinct answer parsed once in
    ``pool`` (default: math_accuracy's). What the answer causes (a parse that raises or spends its budget)
    makes its key its text; math-verify missing or broken raises RewardInfrastructureError."""
    pool = pool or default_pool()
    distinct = list(dict.fromkeys((a.text, a.kind) for a in answers if a.text is not None))
    outcomes = pool.pool.run([(_answer_key, d, {}) for d in distinct], pool.timeout_s)
    keys = {}
    for (text, kind), outcome in zip(distinct, outcomes):
        if outcome.fatal:
            raise RewardInfrastructureError(f"math answers cannot be keyed: {outcome.error}")
        keys[text, kind] = outcome.value if outcome.ok and outcome.value else f"text {text_key(text)}"
    return [None if a.text is None else keys[a.text, a.kind] for a in answers]
