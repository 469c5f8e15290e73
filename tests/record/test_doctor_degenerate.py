"""No silent healthy verdict: the doctor on degenerate runs (a reward always 0 or always 1, periodic
held-out evaluations after a before-training score, no held-out set, one step, a run stopped by a
signal), each planted run next to the healthy one that must stay silent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpokit.record.doctor import DoctorConfig, diagnose, examine, format_findings, health_config
from grpokit.record.health import HealthMonitor
from grpokit.record.learning_checks import check_zero_std
from grpokit.record.report_data import load_run
from helpers.doctor_runs import codes, healthy_rows, write_run


def constant_rows(value: float, n: int = 60) -> list[dict]:
    """A run whose every completion scores `value`: every group has zero spread, and every group is
    "solved" in the sense of the step (all completions earn the step's best), the trap of issue 47."""
    rows = [{k: v for k, v in r.items() if k != "eval/accuracy"} for r in healthy_rows(n)]
    return [
        r
        | {
            "reward": value,
            "reward_std": 0.0,
            "rewards/math/mean": value,
            "rewards/format/mean": value,
            "completions/reward_min": value,
            "completions/reward_max": value,
            "completions/frac_groups_solved": 1.0,
            "frac_reward_zero_std": 1.0,
            "grad_norm": 0.0,
            "loss": 0.0,
        }
        for r in rows
    ]


def test_a_reward_always_0_or_always_1_is_an_error_not_nothing_to_fix(tmp_path: Path) -> None:
    for value in (0.0, 1.0):
        run = load_run(write_run(tmp_path / str(value), constant_rows(value)))
        found = diagnose(run)
        assert found[0].code == "reward_constant" and found[0].level == "error"
        assert f"always {value:g}" in found[0].title and "steps 1-60" in found[0].evidence
        # the zero-std and zero-gradient findings restate it: one finding names the cause
        assert "zero_std_groups" not in [f.code for f in found] and "zero_grad_steps" not in [f.code for f in found]
        assert "nothing to fix" not in format_findings(examine(run), "r")
    assert "reward_constant" not in codes(write_run(tmp_path / "healthy", healthy_rows()))


def test_zero_std_groups_of_a_constant_run_are_waste_not_solved(tmp_path: Path) -> None:
    """The same all-zero-std rows with the reward varying elsewhere in the run: solved groups are discounted
    only at steps whose best completion earns the run's best reward, as the live monitor does."""
    rows = constant_rows(0.0)
    rows[0] |= {"completions/reward_max": 1.0, "reward": 0.1, "reward_std": 0.2}  # one completion once scored 1
    run = load_run(write_run(tmp_path / "run", rows))
    # steps 2-60: at 0, below the run's best: not solved, so the zero-std check finds them waste ...
    assert check_zero_std(run, health_config(run), DoctorConfig()) is not None
    # ... and the doctor names the cause: the reward pinned at 0 in 59 of 60 steps (98% >= 90%), its median
    # 0 in the first 10 steps and the last 10; the zero-std, zero-gradient and spread findings restate it
    found = diagnose(run)
    assert [f.code for f in found] == ["reward_constant"] and found[0].title.startswith("The reward is pinned at 0 ")
    # the live health monitor warns on the same run: doctor and monitor agree
    mon = HealthMonitor()
    warned = {e.monitor for i, r in enumerate(rows, 1) for e in mon.observe(r, i)[0] if e.level == "warning"}
    assert "zero_std_groups" in warned


def test_the_before_training_score_is_the_baseline_with_periodic_evaluations(tmp_path: Path) -> None:
    # eval_every=10: accuracy 0.05 at steps 10-60 after 0.6 before training, reward rising: the policy
    # collapsed on held-out prompts. Judged from the first periodic evaluation this looked flat (no finding).
    rows = [r | ({"eval/accuracy": 0.05} if "eval/accuracy" in r else {}) for r in healthy_rows()]
    run = write_run(tmp_path / "collapse", rows)
    (run / "summary.json").write_text(json.dumps({"eval_before": {"accuracy": 0.6}, "steps": 60}))
    found = diagnose(load_run(run))
    assert found[0].code == "reward_hacking_heldout"
    assert "held-out accuracy 0.6 (step 0) -> 0.05 (step 60)" in found[0].evidence
    # a run that learned before its first periodic evaluation (0.3 -> 0.55 by step 10, 0.56 at the end):
    # from the first periodic point this looked like reward hacking; from the baseline it is learning
    rows = [
        r | ({"eval/accuracy": 0.55 + 0.01 * (r["step"] == 60)} if "eval/accuracy" in r else {}) for r in healthy_rows()
    ]
    run = write_run(tmp_path / "early", rows)
    (run / "summary.json").write_text(json.dumps({"eval_before": {"accuracy": 0.3}, "steps": 60}))
    assert codes(run) == []
    (run / "summary.json").unlink()
    assert codes(run) == ["reward_hacking_heldout"]  # without the baseline the doctor cannot know better


def test_no_heldout_set_is_said_not_silent(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "eval/accuracy"} for r in healthy_rows()]
    diag = examine(load_run(write_run(tmp_path / "run", rows)))
    assert diag.findings == []
    text = format_findings(diag, "run")
    assert (
        "not checked: held-out accuracy (reward hacking against it, drops), for want of a held-out evaluation" in text
    )
    assert "1.4 rollouts paid per useful one: 29% of groups carried no signal" in text  # 1 / (1 - 0.29)
    # the healthy run with its evaluations: no such note
    assert "not checked: held-out" not in format_findings(
        examine(load_run(write_run(tmp_path / "h", healthy_rows()))), "h"
    )


def test_one_step_runs(tmp_path: Path) -> None:
    healthy = examine(load_run(write_run(tmp_path / "one", healthy_rows()[:1])))
    assert healthy.findings == [] and [n.code for n in healthy.notes if n.code == "too_short"] == ["too_short"]
    assert "1 step(s) logged: the trend checks" in format_findings(healthy, "one")
    dead = diagnose(load_run(write_run(tmp_path / "dead", constant_rows(0.0, n=1))))
    assert [f.code for f in dead] == ["reward_constant"]  # a level check: one step is enough to see it


def test_a_run_stopped_by_a_signal(tmp_path: Path) -> None:
    # stopped at step 30 by SIGTERM: no final evaluation; the baseline is still the before-training score
    rows = [r | ({"eval/accuracy": 0.1} if "eval/accuracy" in r else {}) for r in healthy_rows()[:30]]
    run = write_run(tmp_path / "run", rows)
    (run / "summary.json").write_text(
        json.dumps({"eval_before": {"accuracy": 0.5}, "interrupted": True, "stop_signal": "SIGTERM", "steps": 30})
    )
    diag = examine(load_run(run))
    assert (
        diag.findings[0].code == "reward_hacking_heldout"
        and "0.5 (step 0) -> 0.1 (step 30)" in diag.findings[0].evidence
    )
    assert "the run was stopped by SIGTERM at step 30, before its final evaluation" in format_findings(diag, "run")
    rows = healthy_rows()[:30]
    run = write_run(tmp_path / "healthy", rows)
    (run / "summary.json").write_text(
        json.dumps({"eval_before": {"accuracy": 0.2}, "interrupted": True, "stop_signal": "SIGINT", "steps": 30})
    )
    diag = examine(load_run(run))
    assert diag.findings == [] and any(n.code == "stopped" for n in diag.notes)


def test_the_live_monitor_runs_the_doctors_checks(tmp_path: Path) -> None:
    """One set of checks: `grpokit train`'s health monitor warns the doctor's findings as they appear
    (every health.doctor_every steps), once each, and not those its own monitors already warn about."""
    from grpokit.config.health import HealthConfig
    from grpokit.record.recorder import health_monitor

    rows = constant_rows(0.0, n=30)
    mon = health_monitor(HealthConfig(doctor_every=10), {}, None)
    events = [e for i, r in enumerate(rows, 1) for e in mon.observe({k: v for k, v in r.items() if k != "step"}, i)[0]]
    doctor = [(e.step, e.monitor) for e in events if e.monitor.startswith("doctor/")]
    assert doctor == [(10, "doctor/reward_constant")]  # at the first check, then never again
    assert "zero_std_groups" in {e.monitor for e in events}  # the live alarm itself, not a doctor copy
    mon = health_monitor(HealthConfig(doctor_every=0), {}, None)
    assert not any(e.monitor.startswith("doctor/") for i, r in enumerate(rows, 1) for e in mon.observe(r, i)[0])
    # the healthy run: no doctor warning at all
    mon = health_monitor(HealthConfig(), {}, None)
    assert not [
        e for i, r in enumerate(healthy_rows(), 1) for e in mon.observe(r, i)[0] if e.monitor.startswith("doctor/")
    ]


def test_heldout_accuracy_that_rose_then_fell(tmp_path: Path) -> None:
    # held-out 0.2 before, 0.8 at step 20, back to 0.4 at step 60: above the baseline (+0.2), yet 0.4 below
    # its best (> heldout_peak_drop 0.1). With the reward rising: reward hacking; flat: the policy got worse.
    acc = {10: 0.6, 20: 0.8, 30: 0.7, 40: 0.6, 50: 0.5, 60: 0.4}
    rows = [r | ({"eval/accuracy": acc[r["step"]]} if "eval/accuracy" in r else {}) for r in healthy_rows()]
    run = write_run(tmp_path / "rising", rows)
    (run / "summary.json").write_text(json.dumps({"eval_before": {"accuracy": 0.2}, "steps": 60}))
    found = diagnose(load_run(run))
    assert [f.code for f in found] == ["reward_hacking_heldout"] and "falls from its best" in found[0].title
    assert "held-out accuracy 0.8 at its best (step 20) -> 0.4 (step 60)" in found[0].evidence
    flat = [r | {"reward": 0.3, "rewards/math/mean": 0.2, "rewards/format/mean": 0.5} for r in rows]
    run = write_run(tmp_path / "flat", flat)
    (run / "summary.json").write_text(json.dumps({"eval_before": {"accuracy": 0.2}, "steps": 60}))
    assert [f.code for f in diagnose(load_run(run))] == ["heldout_drop"]
    # a wobble of 0.05 below the best is noise of one evaluation, not a fall
    rows = [
        r | ({"eval/accuracy": 0.75 if r["step"] == 60 else acc[r["step"]]} if "eval/accuracy" in r else {})
        for r in healthy_rows()
    ]
    run = write_run(tmp_path / "wobble", rows)
    (run / "summary.json").write_text(json.dumps({"eval_before": {"accuracy": 0.2}, "steps": 60}))
    assert codes(run) == []


def test_a_run_whose_every_update_was_non_finite_is_named_not_nothing_to_fix(tmp_path: Path) -> None:
    """Three steps, all grad_norm inf (every update skipped): no finite value to take a median of, and the
    non-finite steps are still the finding; the live alarms of health.jsonl are the doctor's notes."""
    rows = [r | {"grad_norm": float("inf")} for r in healthy_rows(3)]
    path = write_run(tmp_path / "run", rows, config="health:\n  nonfinite_keys: [loss, grad_norm]\n")
    said = "Non-finite grad_norm=inf: this update was skipped"
    events = [
        {"step": s, "monitor": "nonfinite", "message": f"{said} ({s} of 3)", "level": "warning"} for s in (1, 2, 3)
    ]
    (path / "health.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    diag = examine(load_run(path))
    # 3 in a row: as many as stop a run of grpokit's (health.max_nonfinite_steps 3), so an error
    assert [(f.code, f.level) for f in diag.findings] == [("nonfinite_updates", "error")]
    assert diag.findings[0].evidence == (
        "loss or grad_norm non-finite at 3 of 3 steps (1-3), 3 in a row "
        "(a run of grpokit's stops at health.max_nonfinite_steps=3)"
    )
    alarm = [n for n in diag.notes if n.code == "live_alarm"]
    assert [(n.text, n.evidence) for n in alarm] == [
        ("the live nonfinite alarm fired 3 time(s) (step(s) 1, 2, 3)", f"{said} (3 of 3)")
    ]
    assert "nothing to fix" not in format_findings(diag, "r")


def test_a_run_that_stopped_with_an_error_is_an_error_finding(tmp_path: Path) -> None:
    path = write_run(tmp_path / "run", healthy_rows(2))
    failed = {"step": 2, "error": "RewardError: reward function 'math' failed on 9 of 16 completions"}
    (path / "summary.json").write_text(json.dumps({"eval_before": {"accuracy": 0.1}, "failed": failed}))
    diag = examine(load_run(path))
    assert diag.findings[0].code == "run_failed" and diag.findings[0].level == "error"
    assert diag.findings[0].evidence == f"after step 2 (the last one recorded): {failed['error']}"
    assert diag.findings[0].advice.endswith("then start the run again (it wrote no checkpoint to resume from)")
    assert "in_progress" not in [n.code for n in diag.notes]  # it is not running: it failed
    (path / "checkpoints" / "step-000002").mkdir(parents=True)
    advice = diagnose(load_run(path))[0].advice
    assert advice.endswith(f"continue with `grpokit train --resume {path}` (from its last checkpoint, step-000002)")


def test_the_trainer_writes_why_it_stopped_and_a_resume_clears_it(tiny_model_dir, tmp_path: Path) -> None:
    """A real run ended by an error after its second step: summary.json says so, and the same run resumed and
    finished no longer does."""
    from grpokit.train import Trainer
    from helpers.runs import ROWS, likes_a, tiny_cfg

    class Fails:
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                raise RuntimeError("the callback's disk is full")

    def config():
        cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{"train.steps": 3, "train.save_every": 1})
        cfg.data.dataset = ""  # rows are passed directly
        return cfg

    tr = Trainer(config(), reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], callbacks=[Fails()], quiet=True)
    with pytest.raises(RuntimeError, match="disk is full"):
        tr.train()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["failed"] == {"step": 1, "error": "RuntimeError: the callback's disk is full"}
    assert diagnose(load_run(tmp_path / "run"))[0].code == "run_failed"
    Trainer(
        config(), reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], resume=tmp_path / "run", quiet=True
    ).train()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "failed" not in summary and summary["steps"] == 3
