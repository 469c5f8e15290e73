"""`grpokit doctor` on runs other trainers wrote: TRL's trainer_state.json (recorded from a real 2-step
TRL run, tests/helpers/trl_runs.py), TensorBoard event files written here by torch's SummaryWriter,
W&B / MLflow CSV exports and JSONL with verl's and OpenRLHF's metric names."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.record.doctor import diagnose, examine
from grpokit.record.run_readers import canonical, load_any
from helpers.doctor_runs import healthy_rows
from helpers.paths import TESTS

TRL_STATE = TESTS / "golden" / "trl_trainer_state.json"


def dead_rows(n: int = 30) -> list[dict]:
    """A run whose reward is always 0 (TRL's names; TRL logs no frac_groups_solved or reward_min/max)."""
    return [
        {"step": s, "reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0, "grad_norm": 0.0, "entropy": 0.5}
        for s in range(1, n + 1)
    ]


def test_names_of_other_trainers_map_onto_grpokits() -> None:
    assert canonical("train/reward") == "reward" and canonical("reward") == "reward"
    assert canonical("critic/score/mean") == "reward" and canonical("actor/pg_clipfrac") == "clip_ratio/region_mean"
    assert canonical("response_length/clip_ratio") == "completions/clipped_ratio"
    assert canonical("val-core/openai/gsm8k/acc/mean@1") == "eval/accuracy"
    assert canonical("train/policy_loss") == "loss" and canonical("eval_reward") == "eval/accuracy"
    assert canonical("my/own_metric") == "my/own_metric"


def test_trl_output_dir_from_a_real_trl_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trl_out"
    (out / "checkpoint-2").mkdir(parents=True)
    shutil.copy(TRL_STATE, out / "checkpoint-2" / "trainer_state.json")  # only a checkpoint's copy: found there
    run, source = load_any(out)
    assert source == "trainer_state.json (checkpoint-2/trainer_state.json)"
    assert [r["step"] for r in run.metrics] == [1, 2]
    logged = set(run.metrics[0])
    assert {
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "entropy",
        "grad_norm",
        "completions/clipped_ratio",
        "rewards/exact/mean",
        "time/step",
    } <= logged
    assert main(["doctor", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    notes = [n["text"] for n in report["notes"]]
    assert report["steps"] == 2 and any(t.startswith("2 step(s) logged") for t in notes)
    assert any("not checked: KL to the reference, for want of kl" in t for t in notes)  # TRL's default beta is 0


def test_tensorboard_events_written_by_summarywriter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    for name, rows in (("healthy", healthy_rows()), ("dead", dead_rows())):
        w = SummaryWriter(log_dir=str(tmp_path / name / "runs" / "x"))
        for r in rows:  # transformers' TensorBoard callback prefixes train/
            for k, v in r.items():
                if k != "step":
                    w.add_scalar(f"train/{k}", v, r["step"])
        w.close()
    run, source = load_any(tmp_path / "healthy")
    assert source == "TensorBoard" and len(run.metrics) == 60 and abs(run.metrics[9]["eval/accuracy"] - 0.3) < 1e-6
    assert diagnose(run) == []
    assert main(["doctor", str(tmp_path / "dead"), "--fail-on", "error"]) == 1
    assert "[reward_constant] The reward is always 0" in capsys.readouterr().out


def test_csv_exports_wide_and_long(tmp_path: Path) -> None:
    rows = dead_rows()
    wide = tmp_path / "wandb.csv"  # W&B: one column per metric, a _step column, __MIN/__MAX columns dropped
    with wide.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["_step", "train/reward", "train/reward__MIN", "train/reward_std", "train/frac_reward_zero_std"])
        w.writerows([[r["step"], r["reward"], -5, r["reward_std"], r["frac_reward_zero_std"]] for r in rows])
    run, source = load_any(wide)
    assert source == "CSV export" and run.metrics[0] == {
        "step": 1,
        "reward": 0.0,
        "reward_std": 0.0,
        "frac_reward_zero_std": 1.0,
    }
    assert diagnose(run)[0].code == "reward_constant"
    long = tmp_path / "mlflow.csv"  # MLflow: key, value, step
    with long.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "value", "step", "timestamp"])
        w.writerows([[k, v, r["step"], 0] for r in healthy_rows() for k, v in r.items() if k != "step"])
    run, _ = load_any(long)
    assert len(run.metrics) == 60 and diagnose(run) == []


def test_verl_and_openrlhf_jsonl(tmp_path: Path) -> None:
    # verl's file logger: {"step": n, "data": {...}} with verl names; the reward (critic/score/*) always 0
    verl = tmp_path / "verl.jsonl"
    verl.write_text(
        "".join(
            json.dumps(
                {
                    "step": s,
                    "data": {
                        "critic/score/mean": 0.0,
                        "critic/score/max": 0.0,
                        "critic/score/min": 0.0,
                        "actor/entropy": 0.6,
                        "response_length/mean": 40.0,
                    },
                }
            )
            + "\n"
            for s in range(1, 21)
        )
    )
    run, _ = load_any(verl)
    assert run.metrics[0] == {
        "step": 1,
        "reward": 0.0,
        "completions/reward_max": 0.0,
        "completions/reward_min": 0.0,
        "entropy": 0.6,
        "completions/mean_length": 40.0,
    }
    assert diagnose(run)[0].code == "reward_constant"
    # OpenRLHF's wandb names: train/kl running away from step 11 (a torn last line is skipped)
    orl = tmp_path / "openrlhf.jsonl"
    orl.write_text(
        "".join(
            json.dumps({"train/global_step": s, "train/reward": 0.1 * s, "train/kl": 0.01 if s <= 10 else 3.0}) + "\n"
            for s in range(1, 31)
        )
        + '{"train/glo'
    )
    diag = examine(load_any(orl)[0])
    assert [f.code for f in diag.findings] == ["kl_clip_runaway"]
    assert any(n.text == "not checked: entropy collapse, for want of entropy" for n in diag.notes)


def test_a_resumed_sessions_values_replace_the_abandoned_ones(tmp_path: Path) -> None:
    """A run logged as transformers' TensorBoardCallback writes it (no restart mark) went NaN at steps 6-10, then
    was resumed from its step-5 checkpoint and ran clean to step 30 in a second event file: the doctor reads
    loss 0.1 at steps 6-10 (the second session's), not NaN (the first's), and finds nothing non-finite."""
    from torch.utils.tensorboard import SummaryWriter

    d = tmp_path / "tb"
    sessions = ((range(1, 11), lambda s: 0.1 if s <= 5 else float("nan")), (range(6, 31), lambda s: 0.1))
    for n, (steps, value) in enumerate(sessions):
        w = SummaryWriter(log_dir=str(d))
        for s in steps:
            w.add_scalar("train/loss", value(s), s)
            w.add_scalar("train/grad_norm", value(s), s)
        w.close()
        # the name carries the second the file was opened: the resumed session's is the later one
        (new,) = [p for p in d.iterdir() if ".host." not in p.name]
        new.rename(d / f"events.out.tfevents.{1700000000 + 100 * n}.host.{n}.0")
    run, _ = load_any(d)
    assert [r["step"] for r in run.metrics] == list(range(1, 31))
    assert [r["loss"] for r in run.metrics[5:10]] == pytest.approx([0.1] * 5)
    assert [f.code for f in diagnose(run)] == []


def test_exports_read_a_restart_as_a_new_session_and_aliases_within_a_row_as_before(tmp_path: Path) -> None:
    """A JSONL export with steps 1, 2, 3, then 2, 3 again (resumed from step 1): steps 2-3 are the second
    session's; an unrelated later line at step 0 (other names) drops nothing; within one line the metric's own
    name wins over its prefixed alias. MLflow's long table, each metric's history in turn, restarts per metric."""
    lines = [
        {"step": 1, "loss": 1.0, "train/loss": 9.0},
        {"step": 2, "loss": 2.0},
        {"step": 3, "loss": 3.0},
        {"step": 2, "loss": 20.0},
        {"step": 3, "loss": 30.0},
        {"step": 0, "hparam/lr": 0.1},
    ]
    export = tmp_path / "run.jsonl"
    export.write_text("".join(json.dumps(r) + "\n" for r in lines))
    run, _ = load_any(export)
    assert run.metrics == [
        {"step": 0, "hparam/lr": 0.1},
        {"step": 1, "loss": 1.0},
        {"step": 2, "loss": 20.0},
        {"step": 3, "loss": 30.0},
    ]
    long = tmp_path / "mlflow.csv"
    with long.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "value", "step"])
        w.writerows([["loss", 1, 1], ["loss", 2, 2], ["loss", 20, 2], ["reward", 0.5, 1], ["reward", 0.6, 2]])
    run, _ = load_any(long)
    assert run.metrics == [{"step": 1, "loss": 1.0, "reward": 0.5}, {"step": 2, "loss": 20.0, "reward": 0.6}]
