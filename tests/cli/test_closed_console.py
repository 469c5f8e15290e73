"""A training run outlives its console (cli/console.py): `grpokit train ... | head` or a `tee` that died
closes the pipe the run prints to; the run goes on to its last step and says so once on the other stream.
Real processes with a real closed pipe: the read end is closed before the run starts, so its first line
already meets EPIPE (it used to end the run with "an internal fault stopped the run (BrokenPipeError)"
and no checkpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpokit.cli.console import NOTE

TRAIN = [sys.executable, "-m", "grpokit", "train", "train.steps=2", "record.report=false", "--out", "run"]


def closed_pipe() -> int:
    read, write = os.pipe()
    os.close(read)
    return write


@pytest.mark.parametrize("both", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_a_run_whose_console_closed_trains_to_its_last_step(tmp_path: Path, both: bool) -> None:
    write = closed_pipe()
    stderr = write if both else subprocess.PIPE  # `2>&1 | head`: nowhere left to say it, the run goes on
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(TRAIN, cwd=tmp_path, stdout=write, stderr=stderr, env=env, timeout=300)
    os.close(write)
    assert done.returncode == 0, done.stderr and done.stderr.decode()[-2000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 2
    if not both:
        assert done.stderr.decode() == NOTE  # once, and nothing else: no traceback at the interpreter's exit


def test_a_broken_pipe_that_is_not_the_console_is_a_named_fault(capsys: pytest.CaptureFixture[str]) -> None:
    # Only the command's own console ends it quietly: a BrokenPipeError from anything else (a worker's
    # socket, a subprocess's stdin) is a fault like any other, said in one sentence. Raised here from a
    # test's frame, the error model names it as the user's code (exit status 2), not a quiet 141.
    from grpokit.cli.errors import run_command

    def command(argv: list[str]) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    assert run_command(command, [], debug=False) == 2
    assert "raised BrokenPipeError: [Errno 32] Broken pipe" in capsys.readouterr().err
