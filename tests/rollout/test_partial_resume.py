"""Exact resume with partial rollouts on: an asynchronous run whose batches mix two weight versions
(rollout.async_partial_tokens), killed with SIGKILL inside a step and resumed, ends bit-exactly where the
uninterrupted run ends (rollout/partial.py: each segment's version is fixed by the batch and segment, not
by when an update finishes), with the sampler thread and with a worker process (rollout.async_workers)."""

import signal
import time

import pytest
import torch

from helpers.train_processes import final_state, finish, start, write_setup

PARTIAL = {"async_staleness": 2, "async_partial_tokens": 2}


@pytest.mark.parametrize("workers", [0, 1], ids=["thread", "worker_process"])
def test_partial_rollouts_sigkill_then_resume_is_bit_exact(workers, tiny_model_dir, tmp_path):
    rollout = {**PARTIAL, "async_workers": workers}
    ref = tmp_path / "ref"
    ref.mkdir()
    cfg = write_setup(ref, tiny_model_dir, rollout=rollout)
    uninterrupted = start(["--config", str(cfg), "--out", str(ref / "run")], ref)

    cfg = write_setup(tmp_path, tiny_model_dir, rollout=rollout, save_every=1)
    victim = start(["--config", str(cfg), "--out", str(tmp_path / "killed")], tmp_path)
    marker = tmp_path / "killed" / "checkpoints" / "step-000003"
    deadline = time.time() + 240
    while not marker.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(0.3)  # inside step 4: its batch and the next ones are being sampled, segment by segment
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, "the run finished before it could be killed; kill earlier"
    rc, _, err = finish(uninterrupted)
    assert rc == 0, err[-2000:]

    rc, _, err = finish(start(["--resume", str(tmp_path / "killed")], tmp_path))
    assert rc == 0, err[-2000:]
    w_ref, m_ref = final_state(ref / "run")
    w_res, m_res = final_state(tmp_path / "killed")
    assert w_ref.keys() == w_res.keys()
    for k in w_ref:
        assert torch.equal(w_ref[k], w_res[k]), k
    assert m_res == m_ref
    # per token: step 0 all version 0; from step 2 on tokens 0-1 are 2 updates old, 2-3 one, 4-5 none
    assert [m["rollout/staleness_max"] for m in m_ref] == [0, 1, 2, 2, 2, 2]
    assert all(0 < m["rollout/staleness"] < 2 for m in m_ref[2:])
