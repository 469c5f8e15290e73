"""Tiny `grpokit train` runs in process for the fault suite: a working folder with a small data file
and a reward module, the run's base overrides, and readers of what the run left."""

import json
import sys

import pytest

from grpokit.cli import main

REWARD = """
import sys, time

def likes_short(completions, **kwargs):
    return [1.0 / (1 + len(c)) for c in completions]

def hangs(completions, **kwargs):
    time.sleep(3600)

def exits(completions, **kwargs):
    sys.exit(3)

def interrupts(completions, **kwargs):
    raise KeyboardInterrupt
"""

BASE = [
    "data.prompt_column=question",
    "data.answer_column=solution",
    "rollout.group_size=2",
    "train.prompts_per_step=2",
    "rollout.max_new_tokens=4",
    "train.steps=3",
    "train.save_every=1",
    "record.sinks=[]",
    "train.threads=1",
    "record.report=false",
    "reward.functions=[faultrew:likes_short]",
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    rows = [{"question": f"{a}+{a}=", "solution": str(2 * a)} for a in range(10, 16)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "faultrew.py").write_text(REWARD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("GRPOKIT_DEBUG", raising=False)
    sys.modules.pop("faultrew", None)
    return tmp_path


def train(*extra, data="train.jsonl"):
    return main(["train", f"data.dataset={data}", *BASE, *extra])


def last_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("grpokit:")]
    assert "Traceback" not in err, err
    return lines[-1]


def steps_in(run) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def raise_as_grpokit(exc: BaseException):
    """Raise ``exc`` from a frame that counts as grpokit's own code: a stand-in for a bug of grpokit
    (grpokit.train.faults tells grpokit's code from the user's by the file of the frame that raised)."""
    import grpokit

    exec(compile("raise exc", grpokit.__file__, "exec"), {"exc": exc})
