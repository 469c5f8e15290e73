"""A run killed with SIGKILL and resumed ends bit-exactly where an uninterrupted run ends."""

import signal
import time

import pytest
import torch

from helpers.train_processes import final_state, finish, start, write_setup


@pytest.mark.slow
@pytest.mark.parametrize("kill_after_step, extra_delay", [(2, 0.0), (4, 0.35)])
def test_sigkill_then_resume_is_bit_exact(tiny_model_dir, tmp_path, reference, kill_after_step, extra_delay):
    cfg = write_setup(tmp_path, tiny_model_dir, save_every=1)  # the reference saves only at its end
    victim = start(["--config", str(cfg), "--out", str(tmp_path / "killed")], tmp_path)
    marker = tmp_path / "killed" / "checkpoints" / f"step-{kill_after_step:06d}"
    deadline = time.time() + 240
    while not marker.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(extra_delay)  # somewhere inside the next step (or its checkpoint write)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, "the run finished before it could be killed; kill earlier"

    rc, _, err = finish(start(["--resume", str(tmp_path / "killed")], tmp_path))
    assert rc == 0, err[-2000:]

    w_ref, m_ref = reference
    w_res, m_res = final_state(tmp_path / "killed")
    assert w_ref.keys() == w_res.keys()
    for k in w_ref:
        assert torch.equal(w_ref[k], w_res[k]), k
    assert m_res == m_ref
