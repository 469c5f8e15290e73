"""Rollout workers on a card (rollout.async_worker_device; ``grpokit rollout-worker --device cuda``), for a lent
GPU (skipped without CUDA; ``bash bench/gpu.sh`` runs them): a worker on the trainer's card gets the snapshots
as CUDA IPC handles and draws the schedule's batches there; a worker on the CPU beside a trainer on the card, and
remote workers on either, draw the same batches as the schedule on their own device; partial rollouts on the
card equal the sampler thread's on the card bit for bit; a worker replaying CUDA graphs draws the eager tokens."""

import copy

import pytest
import torch

from grpokit.rollout.async_remote import host_record
from helpers.models import tiny_qwen2
from helpers.net import free_port
from helpers.rollout_workers import (
    KEY,
    bump,
    expected_batch,
    process_engine,
    remote_worker,
    run_steps,
    thread_batches,
)
from helpers.runs import make

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


def _on_card():
    return tiny_qwen2(seed=1).to(CUDA)


@pytest.mark.parametrize("where", [CUDA, CPU], ids=["worker on the card", "worker on the cpu"])
def test_a_trainer_on_the_card_has_a_worker_draw_the_schedule(where):
    """The trainer's snapshots live on the card: a worker there reads them through CUDA IPC handles, a worker on
    the CPU copies each version across; either way every batch is the schedule's drawn on the worker's device."""
    engine, model = process_engine(1, model=_on_card(), device=where)
    try:
        _, metrics = run_steps(engine, model, 3, device=where)
    finally:
        engine.close()
    assert metrics["rollout/workers"] == 1 and metrics["rollout/worker_faults"] == 0


def test_partial_rollouts_on_the_card_equal_the_sampler_threads_bit_for_bit():
    """Staleness 2, segments of 3 tokens: the worker waits mid-batch for versions published later, pushed as IPC
    handles; its tokens, versions and log-probabilities equal the thread's on the same card."""
    want = thread_batches(2, 4, partial_tokens=3, device=CUDA)
    engine, model = process_engine(1, staleness=2, partial_tokens=3, model=_on_card(), device=CUDA)
    try:
        got, _ = run_steps(engine, model, 4, check=False)
    finally:
        engine.close()
    assert any(3 in vs for vs in got[3][2])  # a version pushed mid-batch was used
    assert got == want


@pytest.mark.parametrize("where", ["cuda", "cpu"])
def test_a_remote_worker_beside_a_trainer_on_the_card_draws_the_schedule_on_its_device(where):
    """The policy goes to a remote worker as a CPU copy (by value), each version staged through page-locked
    memory into its gloo pair; ``--device cuda`` moves it to this host's card. Partial rollouts push versions."""
    device = torch.device(where, 0) if where == "cuda" else CPU
    port = free_port()
    worker = remote_worker(port, KEY, "--device", where)
    engine, model = process_engine(0, remote=1, port=port, model=_on_card())
    try:
        run_steps(engine, model, 3, device=device)
    finally:
        engine.close()
    assert worker.wait(60) == 0, worker.stderr.read()


def test_a_worker_on_the_card_replays_cuda_graphs_and_draws_the_eager_tokens():
    engine, model = process_engine(1, model=_on_card(), device=CUDA, cuda_graphs=True)
    try:
        for k in range(3):
            ids, lps = expected_batch(engine, k, CUDA)  # eager
            _, ro = engine.prefetched(2, 3)
            assert ro.completion_ids == ids, k
            for a, b in zip(ro.sampling_logprobs, lps):
                assert max((abs(x - y) for x, y in zip(a, b)), default=0.0) < 1e-4
            bump(model)
            engine.after_update(model, k + 1)
    finally:
        engine.close()


def test_a_remote_workers_record_holds_a_cpu_copy_and_the_card_no_second_one():
    model = _on_card()
    want = copy.deepcopy(model.state_dict())
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    record = host_record({"model": model, "seed": 7})
    assert torch.cuda.max_memory_allocated() == before  # the copy never passed through the card
    assert record["seed"] == 7 and record["model"] is not model
    got = record["model"].state_dict()
    assert all(t.device == CPU for t in got.values()) and all(t.is_cuda for t in model.state_dict().values())
    assert all(torch.equal(got[k], want[k].cpu()) for k in want)
    trainable = [n for n, p in record["model"].named_parameters() if p.requires_grad]
    assert trainable == [n for n, p in model.named_parameters() if p.requires_grad]


@pytest.mark.parametrize("where", ["", "cpu"], ids=["the trainer's card", "the cpu"])
def test_a_run_on_the_card_trains_with_a_worker_process(tiny_model_dir, tmp_path, caplog, where):
    import json
    import logging

    over = {"model.device": "cuda", "rollout.async_staleness": 1, "rollout.async_workers": 1}
    tr = make(tiny_model_dir, tmp_path / "run", **over, **{"rollout.async_worker_device": where, "train.steps": 3})
    with caplog.at_level(logging.WARNING):
        tr.train()
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"reward"' in l]
    assert [r["rollout/workers"] for r in rows] == [1.0, 1.0, 1.0]
    assert [r["rollout/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    shared = [r for r in caplog.records if "beside the update" in r.getMessage()]
    assert len(shared) == (1 if where == "" else 0)
