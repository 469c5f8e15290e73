"""The doctor's reward-fault finding reads faults by kind (rewards/runner.py): completions scored 0 for
their own fault (`zeroed`: time-outs, tampering, crashes, limits), the machine's failures, and the
function's own failures, each with its own advice; the planted runs are tests/helpers/doctor_runs.py's."""

from __future__ import annotations

from pathlib import Path

from grpokit.record.doctor import diagnose
from grpokit.record.report_data import load_run, panels
from helpers.doctor_runs import healthy_rows, write_run

# 4 prompts x G=8: 32 completions per step, one reward function (math): 8 zeroed items are 25% of a step
CONFIG = "train:\n  prompts_per_step: 4\nrollout:\n  group_size: 8\n  max_new_tokens: 64\nreward:\n  timeout_s: 5\n"


def planted(tmp_path: Path, from_step: int, **per_step: float) -> Path:
    """The healthy run with `rewards/math/<kind>` = value at every step from `from_step` (0 before)."""
    rows = healthy_rows()
    for r in rows:
        for kind, v in per_step.items():
            r[f"rewards/math/{kind}"] = v if r["step"] >= from_step else 0.0
    return write_run(tmp_path / "run", rows, CONFIG)


def test_zeroed_time_outs_rising_are_a_possible_hack_not_a_budget_to_raise(tmp_path: Path) -> None:
    # steps 21-60: 8 completions per step time the verifier out and score 0 (40 x 8 = 320), no failures
    found = diagnose(load_run(planted(tmp_path, 21, zeroed=8.0, timeouts=8.0)))
    assert [f.code for f in found] == ["verifier_failures_rising"] and found[0].severity == 3
    ev = found[0].evidence
    # 0% in steps 1-10, 8/32 = 25% in steps 51-60
    assert "failed + zeroed reward items 0.0% -> 25.0% (steps 1-10 vs 51-60)" in ev
    assert "math: 320 scored 0 for their own fault (320 verification out of budget)" in ev
    assert "0 failures" not in ev and "of them time-outs" not in ev
    assert "possibly a reward hack" in found[0].advice and "raise reward.timeout_s" not in found[0].advice


def test_tampering_from_the_start_is_named_as_a_hack(tmp_path: Path) -> None:
    # 2 of 32 per step (6.25%, under reward_failure_max 10%) from step 1: not rising, a warning
    found = diagnose(load_run(planted(tmp_path, 1, zeroed=2.0, tampering=2.0)))
    assert [f.code for f in found] == ["reward_failures"] and found[0].severity == 1
    assert found[0].title == "Completions tamper with the sandbox (scored 0)"
    assert "6.2% scored 0 for the completion's own fault; math: 120 scored 0 for their own fault (120 tampering)" in (
        found[0].evidence
    )
    assert "reward hack" in found[0].advice and "timeout_s" not in found[0].advice


def test_machine_failures_point_at_the_machine(tmp_path: Path) -> None:
    rows = healthy_rows()
    for r in rows:  # 3 of 32 items per step lost to dead workers: counted failures (failure_value)
        r |= {"rewards/failed_fraction": 3 / 32, "rewards/math/failures": 3.0, "rewards/math/machine_failures": 3.0}
    found = diagnose(load_run(write_run(tmp_path / "run", rows, CONFIG)))
    assert [f.code for f in found] == ["reward_failures"] and found[0].title == "Reward functions fail"
    assert "math: 180 failures, 180 the machine's" in found[0].evidence
    advice = found[0].advice
    assert "the machine's, not the function's" in advice and "fix the function" not in advice
    assert "timeout_s" not in advice


def test_calls_cut_at_the_deadline_beside_zeroed_time_outs_are_told_apart(tmp_path: Path) -> None:
    # per step: 2 completions out of their verification budget (zeroed) and 1 call cut at reward.timeout_s
    # (a failure): timeouts = 3, zeroed = 2, failures = 1
    found = diagnose(load_run(planted(tmp_path, 1, zeroed=2.0, timeouts=3.0, failures=1.0)))
    ev = found[0].evidence
    assert "math: 60 failures, 60 of them time-outs; 120 scored 0 for their own fault (120 verification" in ev
    assert "raise reward.timeout_s (now 5)" in found[0].advice and "possibly a reward hack" in found[0].advice


def test_the_reports_faults_panel_shows_every_kind(tmp_path: Path) -> None:
    path = planted(tmp_path, 1, zeroed=4.0, timeouts=1.0, tampering=1.0, crashes=1.0, limits=1.0, machine_failures=1.0)
    faults = {p["id"]: p["keys"] for p in panels([load_run(path)])}["faults"]
    kinds = ("machine_failures", "zeroed", "timeouts", "tampering", "crashes", "limits")
    assert [k for k in faults if k.startswith("rewards/math/")] == [f"rewards/math/{k}" for k in kinds]
