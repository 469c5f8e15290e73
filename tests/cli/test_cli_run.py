"""`grpokit train` on one's own data, in process: a module:function reward beside the data is found
(as from the console script, whose sys.path does not hold the working directory), it receives the
answer column under its own name, and Ctrl-C leaves a checkpoint and the report, or says truthfully
that there is none. Tiny runs on the 0.26M demo model (a few seconds)."""

import json
import sys

import pytest

from grpokit.cli import main

REWARD = """
import os, signal

CALLS = []
STOP_AT = {stop_at}


def likes_short(completions, solution, answer, **kwargs):
    CALLS.append((list(solution), list(answer)))
    if len(CALLS) == STOP_AT:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, while the step is in progress
    return [1.0 / (1 + len(c)) for c in completions]
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder with train.jsonl, as the user's working directory, off sys.path (the console
    script's sys.path[0] is its bin folder)."""
    rows = [{"question": f"{a}+{a}=", "solution": str(2 * a)} for a in range(10, 16)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    return tmp_path


def train(*extra):
    return main(
        [
            "train",
            "data.dataset=train.jsonl",
            "data.prompt_column=question",
            "data.answer_column=solution",
            "rollout.group_size=2",
            "train.prompts_per_step=2",
            "rollout.max_new_tokens=4",
            "train.steps=3",
            "record.sinks=[]",
            "train.threads=1",
            *extra,
        ]
    )


def reward_module(workdir, name, stop_at):
    (workdir / f"{name}.py").write_text(REWARD.format(stop_at=stop_at))
    sys.modules.pop(name, None)


def test_module_reward_beside_the_data_gets_the_answer_column_under_its_own_name(workdir, capsys):
    reward_module(workdir, "myrewards", stop_at=0)
    assert train("reward.functions=[myrewards:likes_short]", "record.report=false", "--out", "run") == 0, (
        capsys.readouterr().err
    )
    calls = sys.modules["myrewards"].CALLS
    assert len(calls) == 6  # one call per group: 2 prompts x 3 steps, no evaluation (no data.eval_dataset)
    solution, answer = calls[0]
    assert solution == answer and len(solution) == 2 and all(s.isdigit() for s in solution)  # G = 2 completions


def test_a_missing_module_says_where_it_looked(workdir, capsys):
    assert train("reward.functions=[nosuchmodule:fn]", "--out", "run") == 2
    err = capsys.readouterr().err.splitlines()[-1]  # (datasets' progress bar precedes it)
    assert err.startswith(
        "grpokit: error: reward.functions: Reward 'nosuchmodule:fn': module 'nosuchmodule' could not be imported"
    )
    assert err.endswith(f"(looked in the working directory {workdir} and on sys.path)")


def test_ctrl_c_finishes_the_step_then_writes_a_checkpoint_and_the_report(workdir, capsys):
    reward_module(workdir, "stopper", stop_at=3)  # one call per group of 2 prompts: call 3 is in step 2
    assert train("reward.functions=[stopper:likes_short]", "--out", "run") == 130
    err = capsys.readouterr().err
    run = workdir / "run"
    assert (
        "grpokit: interrupted after step 2 of 3; checkpoint run/checkpoints/step-000002 and report.html kept; "
        "continue with: grpokit train --resume run"
    ) in err
    assert (run / "report.html").exists() and json.loads((run / "summary.json").read_text())["interrupted"] is True
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert main(["train", "--resume", str(run)]) == 0  # the checkpoint is real: the run goes on to step 3
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and "interrupted" not in summary
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_ctrl_c_before_the_first_step_says_there_is_no_checkpoint(workdir, capsys):
    reward_module(workdir, "early", stop_at=1)  # the first call grades the evaluation before training
    assert (
        train(
            "reward.functions=[early:likes_short]", "data.eval_dataset=train.jsonl", "data.eval_size=2", "--out", "run"
        )
        == 130
    )
    err = capsys.readouterr().err
    assert "interrupted before the first step finished; no checkpoint was written, so there is nothing to resume" in err
    assert not (workdir / "run" / "checkpoints").exists() and (workdir / "run" / "report.html").exists()
