"""Under torchrun, rank 0 alone prints: two gloo processes on 127.0.0.1 run the
CLI; each line of the run (the run folder, the step line, the summary) and a user's mistake appear
once, not once per process."""

import os
import socket
import subprocess
import sys


def _torchrun(tmp_path, *args):
    with socket.socket() as s:  # a free port for the rendezvous on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "-m",
        "grpokit",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}  # torchrun's torchelastic_* logs too
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_two_ranks_print_each_line_once(tmp_path):
    done = _torchrun(tmp_path, "train", "train.steps=1", "data.eval_size=0", "record.report=false", "--out", "run")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [l for l in done.stdout.splitlines() if l.strip()]
    assert lines.count("grpokit: run folder run") == 1, lines
    assert sum(l.startswith("step 1/1") for l in lines) == 1, lines
    assert sum(l.startswith("grpokit: 1 steps;") for l in lines) == 1, lines


def test_a_users_mistake_is_printed_by_rank_0_only(monkeypatch, capsys):
    # in process (a torchrun launch costs ~20 s): the sentence every rank would print identically
    from grpokit.cli.app import main

    for rank, want in (("1", 0), ("0", 1)):
        monkeypatch.setenv("RANK", rank)
        assert main(["train", "algo.scale=nope"]) == 2
        errors = [l for l in capsys.readouterr().err.splitlines() if l.startswith("grpokit: error:")]
        assert len(errors) == want and all("algo.scale" in e for e in errors), (rank, errors)
