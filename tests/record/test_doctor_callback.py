"""DoctorCallback inside TRL's own GRPOTrainer (a real 2-step run of the tiny chat model on the CPU):
a reward that is always 0 is named at the first logged step and, with stop_on="error", stops the run;
the trainer_state.json that run leaves is then read by `grpokit doctor` to the same finding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.record.doctor_callback import DoctorCallback
from helpers.trl_runs import always_zero, run_trl


def test_doctor_callback_in_trl_grpotrainer_stops_a_dead_run(chat_model, tmp_path: Path, capsys) -> None:
    said: list[str] = []
    doctor = DoctorCallback(stop_on="error", log=said.append)
    trainer = run_trl(chat_model, tmp_path / "out", [always_zero], callbacks=[doctor], steps=2)
    assert trainer.state.global_step == 1  # stopped after the first step, not run to max_steps=2
    assert [(step, f.code) for step, f in doctor.findings] == [(1, "reward_constant")]
    assert said[0].startswith("grpokit doctor: step 1: [reward_constant] (error) The reward is always 0")
    assert said[-1] == "grpokit doctor: stopping the run at step 1 on [reward_constant] (stop_on='error')"
    capsys.readouterr()
    assert main(["doctor", str(tmp_path / "out"), "--json", "--fail-on", "error"]) == 1
    assert json.loads(capsys.readouterr().out)["findings"][0]["code"] == "reward_constant"


def test_doctor_callback_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"stop_on='always'\) is not valid; give None, 'warning' or 'error'"):
        DoctorCallback(stop_on="always")
    with pytest.raises(ValueError, match=r"every=0\) is not valid"):
        DoctorCallback(every=0)


def test_doctor_callback_reads_logs_as_a_trainer_gives_them(tmp_path: Path) -> None:
    """Without a trainer: on_log with a transformers TrainerState/TrainerControl, prefixed names."""
    from transformers import TrainerControl, TrainerState

    from helpers.doctor_runs import healthy_rows

    said: list[str] = []
    doctor = DoctorCallback(log=said.append)
    state, control = TrainerState(), TrainerControl()

    class Args:
        output_dir = str(tmp_path)

    for r in healthy_rows():
        state.global_step = r["step"]
        logs = {f"train/{k}": v for k, v in r.items() if k not in ("step", "eval/accuracy")}
        doctor.on_log(Args(), state, control, logs=logs | {"epoch": 0.5})
        if "eval/accuracy" in r:
            doctor.on_log(Args(), state, control, logs={"eval_reward": r["eval/accuracy"]})
    assert doctor.findings == [] and said == [] and not control.should_training_stop
    assert len(doctor.rows) == 60 and doctor.rows[9]["eval/accuracy"] == pytest.approx(0.3)
