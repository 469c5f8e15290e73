"""The doctor runs the domain interference check (record/domain_checks.py) among its CHECKS, and the
report draws one panel set per domain before its per-namespace fallback, on planted two-domain runs
(tests/helpers/doctor_runs.py)."""

from __future__ import annotations

from pathlib import Path

from grpokit.record.doctor import diagnose
from grpokit.record.report_data import load_run, panels
from helpers.doctor_runs import codes, two_domain_run


def test_a_domain_falling_while_the_other_rises_is_found_by_the_doctor(tmp_path: Path) -> None:
    # math trained first (steps 1-30), then calc: math 0.40 -> 0.50 (step 20) -> 0.30 (step 40) while calc
    # 0.10 -> 0.12 -> 0.45: between steps 20 and 40 math fell 0.20 > heldout_drop 0.05 and calc rose 0.33
    path = two_domain_run(tmp_path / "run", [0.40, 0.50, 0.30, 0.31], [0.10, 0.12, 0.45, 0.46])
    found = [f for f in diagnose(load_run(path)) if f.code == "domain_interference"]
    assert len(found) == 1 and "'math' got worse" in found[0].title and "'calc' improved" in found[0].title
    assert "between step 20 and step 40 (train.stages 0, 1)" in found[0].evidence
    assert "math 0.5 -> 0.3, of calc 0.12 -> 0.45" in found[0].evidence
    assert found[0].steps == (20, 40) and found[0].panel == "domain-0-0"  # math is the first domain logged
    assert found[0].panel in {p["id"] for p in panels([load_run(path)])}


def test_domains_that_rise_together_are_no_finding(tmp_path: Path) -> None:
    # both rise; math's dip 0.50 -> 0.47 (0.03) at the switch stays under heldout_drop 0.05
    path = two_domain_run(tmp_path / "run", [0.40, 0.50, 0.47, 0.55], [0.10, 0.12, 0.45, 0.46])
    assert codes(path) == []


def test_the_report_draws_panels_per_domain_before_the_namespace_fallback(tmp_path: Path) -> None:
    path = two_domain_run(tmp_path / "run", [0.40, 0.50, 0.47, 0.55], [0.10, 0.12, 0.45, 0.46])
    plots = {p["title"]: p["keys"] for p in panels([load_run(path)])}
    assert plots["Domain math: reward and accuracy"] == ["domain/math/reward", "eval/domain/math/accuracy"]
    assert plots["Domain calc: reward and accuracy"] == ["domain/calc/reward", "eval/domain/calc/accuracy"]
    assert plots["Domain math: groups without signal (fractions)"] == ["domain/math/zero_std"]
    # no per-namespace panel repeats them ("domain/math", "eval/domain/math" would be the fallback's titles)
    assert not [t for t, keys in plots.items() if not t.startswith("Domain") and any("domain/" in k for k in keys)]
