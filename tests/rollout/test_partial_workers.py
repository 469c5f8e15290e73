"""Partial rollouts in worker processes (rollout.async_partial_tokens with rollout.async_workers): real workers
decode each batch in segments, waiting at a segment boundary for a version the trainer publishes later, and
return the sampler thread's batches bit for bit (tokens, per-token versions and sampling log-probabilities);
a worker killed or stopped mid-batch is a counted fault with its own sentence, and with ``drop`` its batch is
redone from its start by another worker, equal to the thread's."""

import os
import re
import signal

import pytest

from grpokit.rollout.async_workers import RolloutWorkerError
from helpers.rollout_workers import bump, process_engine, run_steps, thread_batches

K = 3  # segments of 3 tokens of max_new_tokens 8: versions j - s, j - s + 1, j - s + 2 (capped at j)


def _batch(ro):
    return ro.completion_ids, ro.sampling_logprobs, ro.sampling_versions


def _take(engine, model, k: int):
    """The trainer's side of step k: take its batch, then publish the weights after k + 1 updates."""
    _, ro = engine.prefetched(2, 3)
    bump(model)
    return _batch(ro), engine.after_update(model, k + 1)


def _thread_batches(staleness: int, steps: int) -> list:
    """The sampler thread's partial batches (rollout/async_.py), the reference the workers must equal."""
    return thread_batches(staleness, steps, K)


@pytest.fixture(scope="module")
def thread_s1():
    return _thread_batches(1, 3)


@pytest.fixture(scope="module")
def thread_s2():
    return _thread_batches(2, 4)


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_sample_the_threads_partial_batches_bit_for_bit(workers, thread_s2):
    engine, model = process_engine(workers, staleness=2, partial_tokens=K)
    try:
        got, metrics = run_steps(engine, model, 4, check=False)
    finally:
        engine.close()
    assert [v for v in got[3][2][0]][:3] == [1, 1, 1]  # batch 3 starts at version 3 - 2 = 1 ...
    assert any(3 in vs for vs in got[3][2])  # ... and ends at version 3: two updates published mid-batch
    assert got == thread_s2
    assert metrics["rollout/staleness_max"] == 2 and 0 < metrics["rollout/staleness"] < 2
    assert metrics["rollout/worker_faults"] == 0


def test_a_worker_killed_at_the_start_is_dropped_and_a_waiting_one_gives_its_batch_back(capsys, thread_s2):
    """Worker 0 dies on batch 0 while worker 1 waits, mid-batch 1, for version 1, which only batch 0's update
    publishes: worker 1 gives batch 1 back, takes batch 0, and then redoes batch 1 from its start."""
    engine, model = process_engine(2, on_fault="drop", staleness=2, partial_tokens=K)
    try:
        victim = engine.pool.workers[0].proc.pid
        os.kill(victim, signal.SIGKILL)
        got, metrics = run_steps(engine, model, 4, check=False)
    finally:
        engine.close()
    assert got == thread_s2
    assert metrics["rollout/worker_faults"] == 1 and metrics["rollout/workers"] == 1
    assert engine.pool.stats.given_back == 1
    out = capsys.readouterr().out
    assert re.search(rf"rollout worker 0 \(pid {victim}\) .* batch 0\b.*; dropped it, 1 left", out), out


def _wait_mid_batch(engine, number: int):
    """Let the pool read worker ``number``'s messages until it waits, mid-batch, for an unpublished version."""
    w = next(w for w in engine.pool.workers if w.number == number)
    while w.phase != "wait":
        engine.pool._pump()
    return w


def test_a_worker_killed_while_waiting_mid_batch_is_dropped_and_its_batch_redone(capsys, thread_s1):
    engine, model = process_engine(2, on_fault="drop", staleness=1, partial_tokens=K)
    try:
        got = [_batch(engine.prefetched(2, 3)[1])]
        w = _wait_mid_batch(engine, 1)  # batch 1: segment 0 by version 0 done, segment 1 needs version 1
        assert (w.job.index, w.segment, w.waiting) == (1, 0, 1)
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.join(10)
        bump(model)
        engine.after_update(model, 1)  # version 1 cannot reach it: the next wait sees it dead, batch 1 goes to worker 0
        for k in (1, 2):
            batch, metrics = _take(engine, model, k)
            got.append(batch)
    finally:
        engine.close()
    assert got == thread_s1
    assert metrics["rollout/worker_faults"] == 1 and metrics["rollout/workers"] == 1
    out = capsys.readouterr().out
    assert re.search(rf"rollout worker 1 \(pid {w.proc.pid}\) .*version 1 .*batch 1.*; dropped it, 1 left", out), out


def test_a_worker_stopped_while_waiting_mid_batch_misses_its_deadline_once_the_version_is_published():
    engine, model = process_engine(1, on_fault="stop", timeout_s=2.0, staleness=1, partial_tokens=K)
    try:
        engine.prefetched(2, 3)
        w = _wait_mid_batch(engine, 0)
        os.kill(w.proc.pid, signal.SIGSTOP)
        bump(model)
        engine.after_update(model, 1)  # the wait was the trainer's; from now on the deadline is the worker's
        with pytest.raises(
            RolloutWorkerError,
            match=rf"^rollout worker 0 \(pid {w.proc.pid}\) did not load version 1 for segment 1 of batch 1 "
            r"within rollout.async_timeout_s=2 s \(hung or stopped\)",
        ):
            engine.prefetched(2, 3)
        assert engine.pool.stats.faults == 1
    finally:
        engine.close()
    with pytest.raises(ProcessLookupError):
        os.kill(w.proc.pid, 0)  # killed, not left stopped
