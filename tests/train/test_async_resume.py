"""An asynchronous run killed with SIGKILL and resumed ends bit-exactly where an uninterrupted asynchronous
run ends (rollout/async_plan.py's rule: each batch's prompts, weights version and generator are fixed, and
a checkpoint keeps the in-flight batches' prompts and older snapshots)."""

import signal
import time

import pytest
import torch

from helpers.train_processes import final_state, finish, start, write_setup

ASYNC = {"async_staleness": 2}


@pytest.fixture(scope="module")
def async_reference(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("async_reference")
    cfg = write_setup(tmp, tiny_model_dir, rollout=ASYNC)
    rc, _, err = finish(start(["--config", str(cfg), "--out", str(tmp / "run")], tmp))
    assert rc == 0, err[-2000:]
    return final_state(tmp / "run")


@pytest.mark.parametrize("kill_after_step, extra_delay", [(3, 0.3), pytest.param(1, 0.0, marks=pytest.mark.slow)])
def test_async_sigkill_then_resume_is_bit_exact(
    tiny_model_dir, tmp_path, async_reference, kill_after_step, extra_delay
):
    cfg = write_setup(tmp_path, tiny_model_dir, rollout=ASYNC, save_every=1)
    victim = start(["--config", str(cfg), "--out", str(tmp_path / "killed")], tmp_path)
    marker = tmp_path / "killed" / "checkpoints" / f"step-{kill_after_step:06d}"
    deadline = time.time() + 240
    while not marker.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(extra_delay)  # somewhere inside a later step, its sampling ahead or its checkpoint write
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, "the run finished before it could be killed; kill earlier"

    rc, _, err = finish(start(["--resume", str(tmp_path / "killed")], tmp_path))
    assert rc == 0, err[-2000:]

    w_ref, m_ref = async_reference
    w_res, m_res = final_state(tmp_path / "killed")
    assert w_ref.keys() == w_res.keys()
    for k in w_ref:
        assert torch.equal(w_ref[k], w_res[k]), k
    assert m_res == m_ref
    assert [m["rollout/staleness"] for m in m_ref] == [0, 1, 2, 2, 2, 2]  # the rule: min(j, s) updates old


def _killed_in_step_3_and_resumed(cfg, tmp_path, env=None) -> None:
    """Run ``cfg`` into tmp_path/killed, SIGKILL it just after its step-3 checkpoint, ``--resume`` it to the end."""
    victim = start(["--config", str(cfg), "--out", str(tmp_path / "killed")], tmp_path, env=env)
    marker = tmp_path / "killed" / "checkpoints" / "step-000003"
    deadline = time.time() + 400
    while not marker.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, "the run finished before it could be killed; kill earlier"
    rc, _, err = finish(start(["--resume", str(tmp_path / "killed")], tmp_path, env=env), timeout=600)
    assert rc == 0, err[-2000:]


def _equals_the_threads_run(run, async_reference) -> list[dict]:
    """The run's final weights and metrics are the thread's run's (but for the worker counts); its metrics."""
    w_ref, m_ref = async_reference
    w_res, m_res = final_state(run)
    for k in w_ref:
        assert torch.equal(w_ref[k], w_res[k]), k
    workers_only = ("rollout/worker_faults", "rollout/workers")
    assert [{k: v for k, v in m.items() if k not in workers_only} for m in m_res] == m_ref
    return m_res


@pytest.mark.slow
def test_worker_processes_killed_and_resumed_equal_the_threads_run(tiny_model_dir, tmp_path, async_reference):
    """rollout.async_workers=1: the same schedule sampled in a worker process; the trainer killed inside
    step 3, resumed (new workers, the checkpoint's in-flight batches redone), ends where the thread's
    uninterrupted run ends."""
    cfg = write_setup(tmp_path, tiny_model_dir, rollout={**ASYNC, "async_workers": 1}, save_every=1)
    _killed_in_step_3_and_resumed(cfg, tmp_path)
    m_res = _equals_the_threads_run(tmp_path / "killed", async_reference)
    assert all(m["rollout/worker_faults"] == 0 for m in m_res)


@pytest.mark.slow
def test_a_persistent_remote_worker_serves_a_killed_trainer_and_its_resumed_run(
    tiny_model_dir, tmp_path, async_reference
):
    """rollout.async_remote_workers=1: a real ``grpokit rollout-worker --persist`` on loopback samples every
    batch (the weights through its gloo pair); the trainer killed with SIGKILL inside step 3 and resumed, the
    same worker joins the resumed run, which ends where the thread's uninterrupted run ends, bit for bit."""
    from helpers.net import free_port
    from helpers.rollout_workers import KEY, remote_worker

    port = free_port()
    rollout = {**ASYNC, "async_remote_workers": 1, "async_listen": f"127.0.0.1:{port}"}
    cfg = write_setup(tmp_path, tiny_model_dir, rollout=rollout, save_every=1)
    worker = remote_worker(port, KEY, "--persist", threads=1)  # the trainer's train.threads (write_setup)
    try:
        # neither run can start without a worker: the one worker served the killed run, then the resumed one
        _killed_in_step_3_and_resumed(cfg, tmp_path, env={"GRPOKIT_ROLLOUT_KEY": KEY})
        assert worker.poll() is None  # and waits for the next
    finally:
        worker.kill()
        worker.communicate()
    _equals_the_threads_run(tmp_path / "killed", async_reference)
