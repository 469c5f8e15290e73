"""Answers too big to check: limits read from the text before the math verifier sees it.

sympy evaluates what it parses: `10^{10^{10}}` asks for a number of ten billion digits, 300 nested
`\\frac` recurse 300 deep, a 1 MB number is parsed digit by digit. Each would run to the verifier's
deadline (3 CPU seconds), cost a worker (killed and replaced) and hold up the batch's other answers.
An answer past one of these limits scores 0 at once (counted as ``limits``, grpokit.rewards.calls): a
gold answer never needs one, and a policy that writes one is not paid for stalling the checker.

- more than ``MAX_CHARS`` characters in the final answer;
- brackets (`{ ( [`) nested deeper than ``MAX_DEPTH``;
- a number with more than ``MAX_DIGITS`` digits once written out: a power of numbers (`9^{9^{9}}`,
  `e^{10^{10}}`) or the factorial of one (`(10^{10})!`, `5000!`), estimated through logarithms.

Pure functions, no math-verify; hand-worked cases in tests/rewards/test_answer_limits.py.
"""

from __future__ import annotations

import math
import re

MAX_CHARS = 1000
MAX_DEPTH = 24
MAX_DIGITS = 10_000  # 10^{10000} is still checked; 10^{10001} is not
_NUM = re.compile(r"\s*(\d+(?:\.\d+)?|e(?![a-zA-Z]))")
_BANG = re.compile(r"\s*!")
_FACT = re.compile(r"(\d+)\s*!|\(([^()]*)\)\s*!|\{([^{}]*)\}\s*!")


def _depth(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch in "({[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")}]" and depth:
            depth -= 1
    return deepest


def _log10_of(text: str, pos: int) -> tuple[float | None, int]:
    """log10 of the numeric power tower starting at ``pos`` (None when it is not one), and its end."""
    m = _NUM.match(text, pos)
    if m is None:
        return None, pos
    base = math.e if m.group(1) == "e" else float(m.group(1))
    end = m.end()
    while (bang := _BANG.match(text, end)) is not None:  # n! (and (n!)! through _FACT): its size, by lgamma
        base = math.inf if base > 1e15 else 10 ** min(300.0, math.lgamma(base + 1) / math.log(10))
        end = bang.end()
    hat = re.compile(r"\s*\^\s*").match(text, end)
    if hat is None:
        return (math.log10(base) if 0 < base < math.inf else 0.0 if base <= 0 else math.inf), end
    exp_pos = hat.end()
    braced = exp_pos < len(text) and text[exp_pos] == "{"
    exp_log, exp_end = _log10_of(text, exp_pos + braced)
    if exp_log is None:
        return None, end
    if braced:
        close = re.compile(r"\s*\}").match(text, exp_end)
        if close is None:  # `2^{n+1}` and the like: not a number
            return None, end
        exp_end = close.end()
    exponent = math.inf if exp_log > 300 else 10**exp_log
    if base <= 1:
        return 0.0, exp_end
    return (math.inf if base == math.inf else exponent * math.log10(base)), exp_end


def _digits(text: str) -> float:
    """The most digits any power tower or factorial of numbers in ``text`` would have written out."""
    most = 0.0
    for m in re.finditer(r"(?<![\d.])(?:\d|e(?![a-zA-Z]))", text):
        log, _ = _log10_of(text, m.start())
        if log is not None:
            most = max(most, log)
    for m in _FACT.finditer(text):
        inner = next(g for g in m.groups() if g is not None)
        log, end = _log10_of(inner, 0)
        if log is None or inner[end:].strip():
            continue
        n = math.inf if log > 300 else 10**log
        most = max(most, math.inf if n > 1e15 else math.lgamma(n + 1) / math.log(10))
    return most


def over_limit(answer: str) -> str | None:
    """Why ``answer`` is too big to check (one phrase), or None when it may go to the verifier."""
    if len(answer) > MAX_CHARS:
        return f"the final answer has {len(answer):,} characters, more than {MAX_CHARS:,}"
    if _depth(answer) > MAX_DEPTH:
        return f"the final answer nests brackets {_depth(answer)} deep, more than {MAX_DEPTH}"
    digits = _digits(answer)
    if digits > MAX_DIGITS:
        size = "more digits than can be counted" if digits == math.inf else f"about {digits:.3g} digits"
        return f"the final answer is a number of {size}, more than {MAX_DIGITS:,}"
    return None
