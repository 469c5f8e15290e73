"""One set of checks for `grpokit doctor` and the live alarms of `grpokit train` (issue 47 item 3): where
the concept is the same, the doctor decides with the live monitor's own check (run_series.live_alarm)
and both read the same rules (health_checks: zeroed share, solved groups, reward level)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpokit.config.health import HealthConfig
from grpokit.record import health_checks
from grpokit.record.doctor import diagnose
from grpokit.record.health_checks import Reading, unsolved_share
from grpokit.record.report_data import load_run
from grpokit.record.run_series import unsolved_zero_std
from helpers.doctor_runs import first_live_step, healthy_rows, sick, write_run


def first_doctor_step(tmp_path: Path, rows: list[dict], code: str) -> int | None:
    for n in range(1, len(rows) + 1):
        if code in [f.code for f in diagnose(load_run(write_run(tmp_path / f"r{n}", rows[:n])))]:
            return n
    return None


@pytest.mark.parametrize(
    ("key", "value", "monitor", "code", "step"),
    [
        # recent 10-value mean over the limit once k values of the jump are in: kl 5.0 (limit 1.0):
        # k x 5 + (10 - k) x ~0.03 > 10 at k = 2; clip 0.9 (0.3): 0.88 k > 2.8 at k = 4;
        # same-length groups 0.9 (0.5): 0.85 k > 4.5 at k = 6
        ("kl", 5.0, "kl_runaway", "kl_clip_runaway", 32),
        ("clip_ratio/region_mean", 0.9, "clip_runaway", "kl_clip_runaway", 34),
        ("completions/frac_groups_same_length", 0.9, "same_length", "same_length_groups", 36),
        # entropy 0.01 against an early mean ~0.49 (limit 0.2 x 0.49 = 0.098), the rest ~0.45:
        # 0.01 k + 0.45 (10 - k) < 0.98 at k = 8; the reward level ~0.58 is no convergence
        ("entropy", 0.01, "entropy_collapse", "entropy_collapse", 38),
        # zero-std 0.95 with ~6% of groups solved (0.1 x step / 60; each step's best is the run's): ~0.89
        # unsolved against ~0.25 before: 0.89 k + 0.25 (10 - k) > 8 at k = 9 (at k = 8 the raw share 0.82
        # is over 0.8 but the unsolved one is not: the monitor says "converged", no warning)
        ("frac_reward_zero_std", 0.95, "zero_std_groups", "zero_std_groups", 39),
    ],
)
def test_the_doctor_on_the_run_so_far_finds_it_at_the_step_the_live_alarm_fires(
    tmp_path: Path, key: str, value: float, monitor: str, code: str, step: int
) -> None:
    # the value jumps at step 31, when the doctor's window (a third of the run so far) is the live one (10)
    rows = [r | ({key: value} if r["step"] > 30 else {}) for r in healthy_rows()[:40]]
    assert first_live_step(rows, monitor) == step
    assert first_doctor_step(tmp_path, rows, code) == step


def test_the_doctor_decides_with_the_live_monitors_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = load_run(sick(tmp_path, kl=5.0))
    assert "kl_clip_runaway" in [f.code for f in diagnose(run)]
    # a live kl_runaway that never fires: the doctor no longer finds the runaway either
    monkeypatch.setitem(health_checks.MONITORS, "kl_runaway", lambda h, cfg: Reading(False, 0.0, ""))
    assert "kl_clip_runaway" not in [f.code for f in diagnose(run)]


def test_solved_groups_are_discounted_by_one_rule(tmp_path: Path) -> None:
    # hand-worked: 60% of groups without signal, 40% solved; the step's best 1.0 is the best seen -> 20%
    assert unsolved_share(0.6, 0.4, 1.0, 1.0, 0.0) == pytest.approx(0.2)
    assert unsolved_share(0.6, 0.4, 0.5, 1.0, 0.0) == 0.6  # the step's best is not the run's: nothing solved
    assert unsolved_share(0.6, 0.4, 0.0, 0.0, 0.0) == 0.6  # rewards never differed (always 0): all waste
    assert unsolved_share(0.6, 0.4, 1.0, 1.0, 0.0, learned=False) == 0.6  # solved from the start: all waste
    rows = healthy_rows()
    for r in rows:
        r |= {"completions/reward_max": 1.0 if r["step"] % 2 else 0.5, "completions/frac_groups_solved": 0.1}
    got = dict(unsolved_zero_std(load_run(write_run(tmp_path / "run", rows)), HealthConfig()))
    # odd steps reach the run's best (1.0): 0.1 solved taken off; even steps do not
    assert got[1] == pytest.approx(rows[0]["frac_reward_zero_std"] - 0.1)
    assert got[2] == pytest.approx(rows[1]["frac_reward_zero_std"])
