"""The doctor's `nonfinite_updates` and `nonfinite_metrics` checks (record/nonfinite_checks.py): NaN / inf values
are named, and a run whose updates (or another metric) were non-finite as many steps in a row as stop a run of
grpokit's (health.max_nonfinite_steps), or at a large share of its steps (DoctorConfig.nonfinite_share), is an
error with a place to resume from; the live doctor of `grpokit train` leaves the updates to the live monitor."""

from __future__ import annotations

import math
import types
from pathlib import Path

from grpokit.cli import main
from grpokit.config.health import HealthConfig
from grpokit.record.doctor import diagnose, examine
from grpokit.record.doctor_callback import DoctorCallback
from grpokit.record.health import HealthMonitor
from grpokit.record.report_data import load_run
from helpers.doctor_runs import healthy_rows, write_run

NAN = float("nan")


def _with(tmp_path: Path, steps, config: str | None = None, **values) -> Path:
    """The healthy 60-step run with `values` ({key: value}) at `steps`."""
    rows = healthy_rows()
    for r in rows:
        if r["step"] in steps:
            r.update(values)
    return write_run(tmp_path / "run", rows, **({"config": config} if config else {}))


def test_weights_that_went_nan_are_an_error_with_the_step_to_resume_from(tmp_path: Path, capsys) -> None:
    """loss and grad_norm NaN at steps 21-60: 40 of 60 steps, 40 in a row >= max_nonfinite_steps 3: an error (0.9),
    so `--fail-on error` fails and the note says where to go back: the onset is step 21, the last checkpoint
    before it step 20 (step 40's is after it)."""
    path = _with(tmp_path, range(21, 61), loss=NAN, grad_norm=NAN)
    for s in (20, 40):
        (path / "checkpoints" / f"step-{s}").mkdir(parents=True)
    diag = examine(load_run(path))
    assert [(f.code, f.level, f.score) for f in diag.findings] == [("nonfinite_updates", "error", 0.9)]
    assert diag.findings[0].evidence == (
        "loss or grad_norm non-finite at 40 of 60 steps (21-60), 40 in a row "
        "(a run of grpokit's stops at health.max_nonfinite_steps=3)"
    )
    assert diag.findings[0].panel == "grad-norm" and diag.findings[0].steps == (21, 60)
    resume = [n for n in diag.notes if n.code == "resume_from"]
    assert [(n.text, n.evidence) for n in resume] == [
        (
            "the run went bad at step 21: resume from the checkpoint of step 20, the last saved before the onset",
            "non-finite loss or grad_norm",
        )
    ]
    assert main(["doctor", str(path), "--fail-on", "error"]) == 1
    capsys.readouterr()


def test_the_streak_is_the_run_s_own_max_nonfinite_steps(tmp_path: Path) -> None:
    """Steps 30 and 31 non-finite: 2 in a row < 3 (the default) and 2 of 60 < 0.1 x 60: a warning (0.65);
    with the run's health.max_nonfinite_steps 2, the live monitor would have stopped it: an error."""
    path = _with(tmp_path, (30, 31), grad_norm=math.inf)
    found = diagnose(load_run(path))
    assert [(f.code, f.level, f.score) for f in found] == [("nonfinite_updates", "warning", 0.65)]
    assert found[0].evidence == "loss or grad_norm non-finite at 2 of 60 steps (30-31), 2 in a row"
    (path / "config.yaml").write_text("health:\n  max_nonfinite_steps: 2\n")
    assert [(f.code, f.level) for f in diagnose(load_run(path))] == [("nonfinite_updates", "error")]


def test_scattered_non_finite_steps_are_an_error_at_a_large_share(tmp_path: Path) -> None:
    """One step in ten: 6 of 60 (steps 10, 20 ... 60) is 0.1 x 60 = 6 and >= 3: an error though none came in a
    row; 5 of 60 (steps 10 ... 50) is below 6: a warning."""
    found = diagnose(load_run(_with(tmp_path / "a", range(10, 61, 10), loss=NAN)))
    assert [(f.code, f.level) for f in found] == [("nonfinite_updates", "error")]
    assert found[0].evidence == "loss or grad_norm non-finite at 6 of 60 steps (10, 20, 30, 40, 50, 60)"
    found = diagnose(load_run(_with(tmp_path / "b", range(10, 51, 10), loss=NAN)))
    assert [(f.code, f.level) for f in found] == [("nonfinite_updates", "warning")]


def test_doctor_callback_stops_a_trainer_once_the_non_finite_steps_become_an_error() -> None:
    """TRL-style logs with grad_norm NaN from step 4: a warning at step 4 (1 step), the same finding again at
    step 6 as an error (steps 4-6: 3 in a row), which stops the trainer with stop_on="error"."""
    said: list[str] = []
    cb = DoctorCallback(stop_on="error", log=said.append)
    stopped = None
    for step in range(1, 41):
        state, control = types.SimpleNamespace(global_step=step), types.SimpleNamespace(should_training_stop=False)
        logs = {"loss": 0.01, "grad_norm": 0.5 if step < 4 else NAN, "reward": 0.3, "reward_std": 0.3}
        cb.on_log(types.SimpleNamespace(output_dir="."), state, control, logs)
        stopped = stopped or (step if control.should_training_stop else None)
    assert [(s, f.code, f.level) for s, f in cb.findings] == [
        (4, "nonfinite_updates", "warning"),
        (6, "nonfinite_updates", "error"),
    ]
    assert stopped == 6
    assert said[-1] == "grpokit doctor: stopping the run at step 6 on [nonfinite_updates] (stop_on='error')"


def test_a_row_without_the_update_keys_breaks_no_streak_of_the_live_monitor() -> None:
    """The live monitor and the doctor count one streak: NaN loss at steps 1 and 3 with an evaluation-only row
    (no loss, no grad_norm) between them is 2 in a row, so max_nonfinite_steps 2 stops the run at step 3."""
    monitor = HealthMonitor(HealthConfig(max_nonfinite_steps=2))
    monitor.observe({"loss": NAN}, 1)
    monitor.observe({"eval/accuracy": 0.5}, 2)
    assert monitor.nonfinite_streak == 1
    monitor.observe({"loss": NAN}, 3)
    assert monitor.nonfinite_streak == 2 and monitor._fatal is not None


def test_every_metric_the_doctor_reads_is_named_when_non_finite(tmp_path: Path) -> None:
    """kl inf at steps 46-60: 15 of 60 in a row (>= 3): an error, on the KL panel, with what such a KL means;
    one NaN entropy (step 50) alone: a warning at 0.5 (no update was skipped); a NaN per-function mean
    (rewards/math/mean: a domain's function scores nothing in a step without its groups) is no finding."""
    found = diagnose(load_run(_with(tmp_path / "kl", range(46, 61), kl=math.inf)))
    assert [(f.code, f.level, f.panel, f.steps) for f in found] == [("nonfinite_metrics", "error", "kl", (46, 60))]
    assert found[0].title == "Non-finite kl (the run went bad)"
    assert found[0].evidence == (
        "kl non-finite at 15 of 60 steps (46-60), 15 in a row "
        "(a run of grpokit's stops at health.max_nonfinite_steps=3)"
    )
    assert found[0].advice.startswith("a KL that overflows means a policy far from the reference")
    found = diagnose(load_run(_with(tmp_path / "entropy", (50,), entropy=NAN)))
    assert [(f.code, f.level, f.score) for f in found] == [("nonfinite_metrics", "warning", 0.5)]
    assert found[0].evidence == "entropy non-finite at 1 of 60 steps (50)"
    assert diagnose(load_run(_with(tmp_path / "component", (50,), **{"rewards/math/mean": NAN}))) == []


def test_a_non_finite_reward_and_a_lost_update_are_two_findings(tmp_path: Path) -> None:
    """reward NaN at steps 46-60 and loss NaN at step 46: two findings, as two watchers. The reward, 15 in a row
    (>= 3), is `nonfinite_metrics`, an error (0.9); the one lost update (1 of 60) `nonfinite_updates`, a
    warning (0.65). The onset note names the update (step 46 for both, the update's named first)."""
    rows = healthy_rows()
    for r in rows[45:]:
        r["reward"] = NAN
    rows[45]["loss"] = NAN  # step 46
    diag = examine(load_run(write_run(tmp_path / "run", rows)))
    assert [(f.code, f.level, f.score) for f in diag.findings] == [
        ("nonfinite_metrics", "error", 0.9),
        ("nonfinite_updates", "warning", 0.65),
    ]
    metrics, updates = diag.findings
    assert metrics.title == "Non-finite reward (the run went bad)"
    assert metrics.evidence == (
        "reward non-finite at 15 of 60 steps (46-60), 15 in a row (a run of grpokit's stops at "
        "health.max_nonfinite_steps=3)"
    )
    assert updates.title == "Non-finite loss or grad_norm: updates lost"
    assert updates.evidence == "loss or grad_norm non-finite at 1 of 60 steps (46)"
    assert [n.evidence for n in diag.notes if n.code == "resume_from"] == ["non-finite loss or grad_norm"]


def test_a_one_step_blip_does_not_set_the_point_to_resume_from(tmp_path: Path) -> None:
    """One NaN entropy at step 5 (1 of 60: a warning, not severe) and kl inf at steps 40-60 (21 in a row >= 3:
    severe). The run went bad at step 40, not 5: with checkpoints at 4 and 30, resume from 30. Before, the
    onset took the first non-finite step of every metric (step 5), and the note said resume from step 4."""
    rows = healthy_rows()
    rows[4]["entropy"] = NAN  # step 5
    for r in rows[39:]:
        r["kl"] = math.inf  # steps 40-60
    path = write_run(tmp_path / "run", rows)
    for s in (4, 30):
        (path / "checkpoints" / f"step-{s}").mkdir(parents=True)
    diag = examine(load_run(path))
    assert [(f.code, f.level) for f in diag.findings] == [("nonfinite_metrics", "error")]
    assert diag.findings[0].steps == (5, 60)  # both named in the finding
    resume = [(n.text, n.evidence) for n in diag.notes if n.code == "resume_from"]
    assert resume == [
        (
            "the run went bad at step 40: resume from the checkpoint of step 30, the last saved before the onset",
            "non-finite kl",
        )
    ]


def test_grpokit_train_is_warned_of_a_nan_update_once_and_trl_by_the_doctor(tmp_path: Path) -> None:
    """A NaN loss at step 4 of 20 in a run of grpokit's: the live `nonfinite` monitor warns of it (once, one
    step); the live doctor leaves `nonfinite_updates` to it (LIVE_MONITORED), so it is not warned twice under
    two names, but still warns of a NaN entropy (step 6), which no live monitor watches. TRL's DoctorCallback
    (no live monitor) warns of both."""
    from grpokit.record.doctor_live import LIVE_MONITORED
    from grpokit.record.recorder import health_monitor

    assert "nonfinite_updates" in LIVE_MONITORED and "nonfinite_metrics" not in LIVE_MONITORED
    monitor = health_monitor(HealthConfig(doctor_every=1), {}, tmp_path)
    cb = DoctorCallback(every=1, log=lambda s: None)
    events = []
    for step in range(1, 21):
        row = {"loss": NAN if step == 4 else 0.01, "grad_norm": 0.5, "reward": 0.3, "reward_std": 0.3}
        row["entropy"] = NAN if step == 6 else 1.0
        events += [(step, e.monitor) for e in monitor.observe(row, step)[0] if "nonfinite" in e.monitor]
        state, control = types.SimpleNamespace(global_step=step), types.SimpleNamespace(should_training_stop=False)
        cb.on_log(types.SimpleNamespace(output_dir="."), state, control, dict(row))
    assert events == [(4, "nonfinite"), (6, "doctor/nonfinite_metrics")]
    assert [(s, f.code) for s, f in cb.findings if "nonfinite" in f.code] == [
        (4, "nonfinite_updates"),
        (6, "nonfinite_metrics"),
    ]


def test_the_report_cards_say_when_the_last_steps_were_non_finite(tmp_path: Path) -> None:
    """reward 1.0 at steps 1-2, 0.4 at 3-9, NaN at 10-12: the last 10 steps (3-12) hold 7 finite values of 0.4
    and 3 NaN, so the card reads "0.4 (3 of the last 10 non-finite)" (not the mean of the last 10 finite
    values, steps 1-9: (2 x 1.0 + 7 x 0.4) / 9 = 0.533); an entropy NaN at every step reads so."""
    from grpokit.record.report import headline_html
    from grpokit.record.report_data import Run

    rows = [{"step": s, "reward": 1.0 if s <= 2 else 0.4 if s <= 9 else NAN, "entropy": NAN} for s in range(1, 13)]
    page = headline_html(Run(tmp_path, "r", metrics=rows))
    assert '<div class="k">reward (last 10)</div><div class="v">0.4 (3 of the last 10 non-finite)</div>' in page
    assert '<div class="k">entropy (last 10)</div><div class="v">non-finite at the last 10 steps</div>' in page
