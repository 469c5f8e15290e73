"""The installed math-verify's version, checked before its first answer (rewards/math.py).

Run on 2026-11-30 with the real packages: under math-verify 0.7 every answer failed (78 tests), under 0.8
a percentage gold no longer equalled the bare number. Those versions cannot be installed beside 0.9 in
one process, so the version is faked here; the comparison and the refusal are grpokit's own."""

from __future__ import annotations

import pytest

import grpokit.rewards.math as m
from grpokit.rewards.errors import RewardInfrastructureError


@pytest.fixture
def installed(monkeypatch):
    def use(v):
        m.math_verify_version_problem.cache_clear()
        monkeypatch.setattr(m, "installed", lambda name: v if name == "math-verify" else None)

    yield use
    m.math_verify_version_problem.cache_clear()


@pytest.mark.parametrize("v", ["0.9.0", "0.9.1", "0.10.0", "1.0.0rc1", "2.3"])
def test_math_verify_09_and_later_is_taken(installed, v):
    installed(v)  # 0.10 > 0.9 as numbers, not as text
    assert m.math_verify_version_problem() == ""
    assert m._parse("$2$") and m._same(m._parse("$2$"), m._parse(r"\boxed{2}"))


@pytest.mark.parametrize("v", ["0.7.0", "0.8.0", "0.6.1"])
def test_an_older_math_verify_is_refused_before_any_answer_with_the_fix(installed, v):
    installed(v)
    with pytest.raises(RewardInfrastructureError) as e:
        m._parse("$2$")
    assert str(e.value) == (
        f"math-verify {v} is installed, and grpokit's math rewards need math-verify >= 0.9 (0.7 fails on every "
        "answer, 0.8 grades some differently): pip install 'math-verify>=0.9'"
    )
