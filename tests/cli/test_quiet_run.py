"""A default `grpokit train` run shows no third-party FutureWarning.

The run is a subprocess with FutureWarnings turned into errors (`-W error::FutureWarning`): a
FutureWarning from transformers, torch or datasets that grpokit does not silence would end the run
with a traceback, and one that is printed rather than raised would show in stderr."""

import os
import subprocess
import sys


def test_one_step_run_has_no_future_warning(tmp_path):
    # the default run (the built-in demo task and model), one step
    cmd = [
        sys.executable,
        "-W",
        "error::FutureWarning",
        "-m",
        "grpokit",
        "train",
        "train.steps=1",
        "record.report=false",
        "--out",
        "run",
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FutureWarning" not in done.stderr + done.stdout, done.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.jsonl").exists()  # the step did run
