"""answer_limits.py: answers too big to check, decided from the text; honest answers pass through."""

import pytest

from grpokit.rewards.answer_limits import MAX_CHARS, MAX_DEPTH, over_limit

# (answer, the phrase its refusal must contain, why) - digits worked out by hand: log10(a^b) = b log10(a)
OVER = [
    ("10^{10^{10}}", "about 1e+10 digits", "10^(10^10) has 10^10 + 1 digits"),
    ("10^{10001}", "about 1e+04 digits", "10,002 digits: one past the limit of 10,000"),
    ("e^{10^{10}}", "about 4.34e+09 digits", "10^10 * log10(e) = 4.34e9"),
    ("(10^{10})!", "about 9.57e+10 digits", "log10((10^10)!) = 9.57e10 by Stirling"),
    ("(10!)!", "about 2.22e+07 digits", "10! = 3,628,800; log10(3628800!) = 2.22e7"),
    ("5000!", "about 1.63e+04 digits", "log10(5000!) = 16,326"),
    ("20^{20!}", "about 3.17e+18 digits", "20! * log10(20) = 2.43e18 * 1.301"),
    ("9^{9^{9^{9^{9}}}}", "more digits than can be counted", "9^9^9 alone has 3.7e8 digits"),
    ("9" * (MAX_CHARS + 1), f"{MAX_CHARS + 1:,} characters", "one character past the limit"),
    ("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), f"{MAX_DEPTH + 1} deep", "one level past the limit"),
]
UNDER = ["10^{10000}", "2^{1024}", "2000!", "3!!", "e^{x^2}", "2^{n+1}", "(x+1)!", "\\frac{1}{2}", "0.5^{10^{10}}"]


@pytest.mark.parametrize("answer,phrase,why", OVER, ids=[w for _, _, w in OVER])
def test_answers_too_big_to_check_are_named(answer, phrase, why):
    assert phrase in (over_limit(answer) or "")


@pytest.mark.parametrize("answer", UNDER)
def test_answers_a_gold_could_be_pass(answer):
    assert over_limit(answer) is None
