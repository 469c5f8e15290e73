"""`grpokit doctor` for CI: --fail-on's exit status, --json, thresholds from --set and --config, and
their refusals in one sentence; a command whose output pipe closed ends quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpokit.cli import main
from helpers.doctor_runs import healthy_rows, sick, write_run


def test_fail_on_sets_the_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    warn = sick(tmp_path / "w", **{"completions/clipped_ratio": 0.4})  # truncated: score 0.7, a warning
    error = sick(tmp_path / "e", frac_reward_zero_std=0.95, **{"completions/frac_groups_solved": 0.0})  # 0.9
    healthy = write_run(tmp_path / "h", healthy_rows())
    status = {
        (name, level): main(["doctor", str(run), "--fail-on", level])
        for name, run in (("warn", warn), ("error", error), ("healthy", healthy))
        for level in ("warning", "error")
    }
    assert status == {
        ("warn", "warning"): 1,
        ("warn", "error"): 0,
        ("error", "warning"): 1,
        ("error", "error"): 1,
        ("healthy", "warning"): 0,
        ("healthy", "error"): 0,
    }
    assert main(["doctor", str(warn)]) == 0  # without --fail-on a finding is not a failure
    capsys.readouterr()
    assert main(["doctor", str(error), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["findings"][0]["code"] == "zero_std_groups" and out["findings"][0]["level"] == "error"
    assert {n["code"] for n in out["notes"]} == {"rollouts_per_useful", "after_last_improvement"}


def test_thresholds_from_the_command_line_and_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = sick(tmp_path / "r", **{"completions/clipped_ratio": 0.4, "kl": lambda s, r: 2.0 + 0.01 * (s % 3)})
    assert main(["doctor", str(run), "--fail-on", "warning"]) == 1
    capsys.readouterr()
    args = ["doctor", str(run), "--fail-on", "warning", "--set", "truncated_max=0.5", "--set", "health.kl_max=5"]
    assert main(args) == 0
    assert "nothing to fix found" in capsys.readouterr().out
    cfg = tmp_path / "doctor.yaml"
    cfg.write_text("doctor:\n  truncated_max: 0.5\nhealth:\n  kl_max: 5\n")
    assert main(["doctor", str(run), "--fail-on", "warning", "--config", str(cfg)]) == 0
    assert (
        main(["doctor", str(run), "--config", str(cfg), "--set", "kl_max=1.5", "--fail-on", "error"]) == 1
    )  # --set wins


@pytest.mark.parametrize(
    "setting, message",
    [
        ("nope=1", "unknown doctor threshold 'nope'; valid: clip_asymmetry_min"),
        ("health.nope=1", "unknown health threshold 'health.nope'"),
        ("truncated_max=lots", "doctor threshold truncated_max='lots' is not valid; give a float like 0.2"),
        ("health.window=0", "health.window must be a positive integer, got 0"),
        ("truncated_max", "--set 'truncated_max' is not NAME=VALUE"),
    ],
)
def test_a_bad_threshold_is_refused_in_one_sentence(tmp_path, capsys, setting, message) -> None:
    run = write_run(tmp_path / "r", healthy_rows())
    assert main(["doctor", str(run), "--set", setting]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_closed_pipe_ends_the_command_quietly() -> None:
    # `grpokit presets | head -1`: the reader has gone before the command writes. The read end is closed
    # before the process starts, so its first write fails with EPIPE (Python ignores SIGPIPE): the command
    # ends with 128 + SIGPIPE = 141, as a shell reports a tool stopped by a closed pipe, and says nothing
    # (it used to print "an internal fault stopped the command (BrokenPipeError ...)" and exit 1).
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-m", "grpokit", "presets"], stdout=write, stderr=subprocess.PIPE, env=env, timeout=120
    )
    os.close(write)
    assert proc.returncode == 141 and proc.stderr.decode() == ""
