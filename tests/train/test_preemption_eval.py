"""A stop that cuts a held-out evaluation is a stop: a real `grpokit train` process sent SIGTERM while an evaluation
hangs exits 143 (128 + 15), summary.json says the signal and which step's evaluation it cut (``eval_owed``), and
``--resume`` runs that evaluation first, so the run ends equal to the uninterrupted one, its evaluations included.
Before, a stop during the final evaluation exited 0 with "2 steps" and neither an ``eval_after`` nor a stop in the
summary (a scheduler saw a finished job), and a cut evaluation at train.eval_every was missing for good."""

import json

import pytest
import torch

from helpers.train_processes import final_state, finish, start, wait_for, write_setup

# the reward calls of these runs, in order (likes_a counts them): an evaluation of the 2 held-out prompts makes 2
# (one completion each, greedy), a step 2 (one per group of 4); so eval_before is calls 1-2, step 1 calls 3-4, then
# with eval_every=1 its evaluation 5-6, step 2 7-8, its evaluation 9-10 ...
CASES = {
    "final": ({"steps": 2}, 7, 2),  # the evaluation after the last step: calls 7-8
    "eval_every": ({"steps": 3, "eval_every": 1}, 9, 2),  # step 2's evaluation: calls 9-10
    "before": ({"steps": 2}, 1, 0),  # the evaluation before the first step
}


def _setup(tmp, model_dir, train: dict) -> list[str]:
    cfg = write_setup(tmp, model_dir, stop_grace_s=1.0, **train)
    return ["--config", str(cfg), f"data.eval_dataset={tmp / 'train.jsonl'}", "data.eval_size=2"]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_stop_during_a_held_out_evaluation_is_a_stop_and_resume_runs_it_first(tiny_model_dir, tmp_path, case):
    train, hang_at, owed = CASES[case]
    (tmp_path / "ref").mkdir()
    rc, _, err = finish(start([*_setup(tmp_path / "ref", tiny_model_dir, train), "--out", "run"], tmp_path / "ref"))
    assert rc == 0, err[-2000:]
    args, run = _setup(tmp_path, tiny_model_dir, train), tmp_path / "run"
    victim = start([*args, "--out", str(run)], tmp_path, env={"HANG_AT_CALL": str(hang_at)})
    wait_for(lambda: (tmp_path / "hanging").exists(), victim)
    victim.terminate()  # SIGTERM while the evaluation's reward hangs: the 1 s grace runs out, the evaluation is cut
    rc, _, err = finish(victim, timeout=120)
    assert rc == 143, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert {k: summary.get(k) for k in ("steps", "interrupted", "stop_signal", "eval_owed")} == {
        "steps": owed,
        "interrupted": True,
        "stop_signal": "SIGTERM",
        "eval_owed": owed,
    }
    assert "eval_after" not in summary and ("eval_before" in summary) == (case != "before")
    at = f"of step {owed} of {train['steps']} (--resume runs it first)" if owed else "before the first step"
    assert f"grpokit: stopped by SIGTERM during the held-out evaluation {at}" in err

    rc, _, err = finish(start(["--resume", str(run)], tmp_path))
    assert rc == 0, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    reference = json.loads((tmp_path / "ref" / "run" / "summary.json").read_text())
    assert summary["eval_after"] == reference["eval_after"] and summary["eval_before"] == reference["eval_before"]
    (w_ref, m_ref), (w_run, m_run) = (
        final_state(tmp_path / "ref" / "run", train["steps"]),
        final_state(run, train["steps"]),
    )
    assert m_run == m_ref  # every step's row once, each evaluation's eval/* in its step's row
    assert all(torch.equal(w_run[k], w_ref[k]) for k in w_ref)
    if owed:  # the cut evaluation was made up once, not skipped: its metrics are in its step's row
        assert "eval/accuracy" in m_run[owed - 1] and summary["earlier_sessions"][0]["eval_owed"] == owed
