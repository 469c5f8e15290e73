"""Two nodes on loopback: two torchrun launchers (--nnodes 2, --node_rank 0 / 1, rendezvous on
127.0.0.1, gloo), two processes each, give the same update as one process (test_distributed.py
proves the one-node case). The launch command is the multi-node one of docs/SCALING.md."""

import os
import socket
import subprocess
import sys

import pytest
import torch

from helpers.paths import TESTS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_of_two_processes_equal_one_process(tiny_model_dir, tmp_path):
    from helpers.distributed import OVER, run

    port, result = _free_port(), tmp_path / "rank0.pt"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "TMPDIR": str(tmp_path),  # torchrun's log folders (torchelastic_*) stay out of /tmp
    }
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--node-rank",
                str(k),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                str(TESTS / "helpers" / "multinode_worker.py"),
                str(tiny_model_dir),
                str(tmp_path / "multi"),
                str(result),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for k in (0, 1)
    ]
    try:
        logs = [n.communicate(timeout=240)[0] for n in nodes]
    finally:
        for n in nodes:
            n.kill() if n.poll() is None else None
    assert all(n.returncode == 0 for n in nodes), "\n".join(l[-3000:] for l in logs)
    four = torch.load(result)
    _, one = run(tiny_model_dir, tmp_path / "one", {**OVER, "train.steps": 1})
    moved = 0
    for name in one:  # four ranks sum gradients in another order than one process: float noise only
        assert torch.allclose(one[name], four[name], atol=1e-6, rtol=1e-5), (
            name,
            (one[name] - four[name]).abs().max().item(),
        )
        moved += 1
    assert moved == len(one) > 0
