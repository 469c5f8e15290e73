"""pass@k, maj@k, mean@k against hand-computed values."""

from __future__ import annotations

import itertools
import math

import pytest

from grpokit.record.passk import maj_at_k, mean_at_k, pass_at_k, summarize


def test_pass_at_k_hand_worked() -> None:
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(4, 1, 3) == pytest.approx(0.75)  # 1 - C(3,3)/C(4,3) = 1 - 1/4
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c/n
    assert pass_at_k(5, 0, 3) == 0.0  # nothing correct
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(5, 4, 2) == 1.0  # only 1 wrong sample < k = 2: C(1,2) = 0


def test_pass_at_k_large_n_is_stable() -> None:
    # n=200, c=3, k=100: C(197,100)/C(200,100) = (100*99*98)/(200*199*198) = 970200/7880400 = 0.123116...
    assert pass_at_k(200, 3, 100) == pytest.approx(1 - 970200 / 7880400)
    # C(2000, 1000) overflows a float; the product form does not.
    exact = 1 - math.comb(1990, 1000) / math.comb(2000, 1000)  # Python ints: exact, then one division
    assert pass_at_k(2000, 10, 1000) == pytest.approx(exact, rel=1e-12)


def test_pass_at_k_matches_brute_force() -> None:
    # Enumerate every k-subset of n=6 samples with c=2 correct: fraction containing a correct one.
    n, c = 6, 2
    samples = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(samples, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_pass_at_k_validates() -> None:
    with pytest.raises(ValueError, match="1 <= k <= n, got k=6 with n=5"):
        pass_at_k(5, 1, 6)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(5, 6, 1)


def test_maj_at_k_votes_and_tie_rule() -> None:
    answers = ["5", "7", "5", "7"]
    correct = [True, False, True, False]
    assert maj_at_k(answers, correct, 4) == 1.0  # tie 2:2, "5" seen first
    assert maj_at_k(["7", "5", "5", "7"], [False, True, True, False], 4) == 0.0  # tie 2:2, "7" seen first
    assert maj_at_k(["7", "5", "5", "7"], [False, True, True, False], 3) == 1.0  # "5" x2 vs "7" x1
    assert maj_at_k([None, None, "3"], [False, False, True], 3) == 1.0  # unparsable answers do not vote
    assert maj_at_k([None, None], [False, False], 2) == 0.0  # no answer at all counts as wrong
    assert maj_at_k(["a", "b"], [False, True], 1) == 0.0  # k=1: just the first sample


def test_mean_at_k() -> None:
    assert mean_at_k([1, 0, 1, 1], 2) == 0.5  # (1 + 0) / 2
    assert mean_at_k([1, 0, 1, 1], 4) == 0.75  # 3 / 4
    with pytest.raises(ValueError, match="got k=5"):
        mean_at_k([1, 0, 1, 1], 5)


def test_summarize_averages_over_prompts() -> None:
    answers = [["5", "5", "4", "4"], ["1", "2", "3", "4"]]
    correct = [[True, True, False, False], [False, False, False, True]]
    out = summarize(answers, correct, ks=(1, 2))
    # pass@1: prompt 0: 2/4, prompt 1: 1/4 -> (0.5 + 0.25) / 2 = 0.375
    assert out["pass@1"] == pytest.approx(0.375)
    # pass@2: prompt 0: 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6; prompt 1: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2
    assert out["pass@2"] == pytest.approx((5 / 6 + 1 / 2) / 2)
    # maj@2: prompt 0 first two "5","5" -> correct; prompt 1 "1","2" tie -> "1" wrong -> 0.5
    assert out["maj@2"] == 0.5
    # mean@1: first sample correct? prompt 0 yes, prompt 1 no -> 0.5; mean@2: (1 + 0) / 2 = 0.5
    assert out["mean@1"] == 0.5 and out["mean@2"] == 0.5
    assert set(out) == {"pass@1", "maj@1", "mean@1", "pass@2", "maj@2", "mean@2"}


def test_summarize_validates() -> None:
    with pytest.raises(ValueError, match="k=4 needs at least 4 samples per prompt, but one prompt has 2"):
        summarize([["a", "b"]], [[True, False]], ks=(1, 4))
    with pytest.raises(ValueError, match="no prompts"):
        summarize([], [], ks=(1,))
