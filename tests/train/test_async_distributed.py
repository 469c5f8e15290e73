"""Asynchronous rollout (rollout.async_staleness=1, the sampler thread) on two gloo ranks equals one process,
and a 2-rank async run interrupted after a checkpoint and resumed equals the uninterrupted one bit for bit.

Each rank samples its slice of the step's prompts with its own snapshots, as rollout/async_plan.py says. The
rollout is scripted as in tests/train/test_distributed.py (completions that depend only on the prompt and the
sample index: the ranks' generators differ by design), but its sampling log-probabilities are the snapshot's
own log-probabilities of those tokens: the importance weights (TIS) then depend on which weights version
sampled the batch, so a rank sampling with another version than the schedule's gives another update.
"""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.distributed import OVER, scripted_generate

ASYNC = {**OVER, "train.steps": 3, "rollout.async_staleness": 1}
KEYS = ("loss", "grad_norm", "kl", "reward", "advantages/std", "tis/ratio_max", "rollout/staleness")


def versioned_generate(model, prompt_ids, group_size, params, **kw):
    """``scripted_generate``'s tokens, with ``model``'s log-probabilities of them (one sequence at a time:
    the same numbers whatever the batch)."""
    ro = scripted_generate(model, prompt_ids, group_size, params, **kw)
    with torch.no_grad():
        for i, toks in enumerate(ro.completion_ids):
            prompt = list(prompt_ids[i // group_size])
            logits = model(torch.tensor([prompt + toks])).logits[0, len(prompt) - 1 : -1].float()
            lp = torch.log_softmax(logits / params.temperature, -1).gather(1, torch.tensor(toks)[:, None])
            ro.sampling_logprobs[i] = lp[:, 0].tolist()
    return ro


class Stop(Exception):
    pass


def run(model_dir, out, over, resume=None, stop_at=0):
    """Train with the versioned scripted rollout; ``stop_at`` > 0 stops right after that step's checkpoint
    (an interruption on every rank), ``resume`` continues a run folder."""
    import grpokit.rollout.engine as engine_mod  # the hf engine (and the async thread) sample with it
    from grpokit.train import Trainer
    from helpers.runs import ROWS, likes_a, tiny_cfg

    real, engine_mod.generate = engine_mod.generate, versioned_generate
    try:
        cfg = tiny_cfg(model_dir, out, **over)
        cfg.data.dataset = ""  # rows are passed directly
        tr = Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=ROWS[:4], resume=resume, quiet=True)
        if stop_at:
            save = tr.save

            def save_then_stop(*args):
                path = save(*args)
                if tr.step == stop_at:
                    tr.engine.close()
                    raise Stop
                return path

            tr.save = save_then_stop
        tr.train()
    finally:
        engine_mod.generate = real
    return {n: p.detach().clone() for n, p in tr.model.named_parameters()}


def _worker(rank, world, init_file, model_dir, out, result_file, over):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )  # a collective mismatch fails instead of hanging
    try:
        weights = run(model_dir, out / "two", over)
        # interrupted right after the step-1 checkpoint (batch 1 in flight, sampled by snapshot 0, which the
        # checkpoint keeps; batch 2 by the checkpoint's own weights), then resumed on 2 ranks
        cut = {**over, "train.save_every": 1}
        try:
            run(model_dir, out / "cut", cut, stop_at=1)
        except Stop:
            pass
        resumed = run(model_dir, out / "cut", cut, resume=out / "cut")
        if rank == 0:
            torch.save({"two": weights, "resumed": resumed}, result_file)
    finally:
        dist.destroy_process_group()


def steps(run_dir):
    import json

    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if '"reward"' in l]


@pytest.mark.slow
def test_async_on_two_gloo_ranks_equals_one_process_and_resumes_exactly(tiny_model_dir, tmp_path):
    result = tmp_path / "rank0.pt"
    mp.spawn(
        _worker,
        args=(2, str(tmp_path / "init"), str(tiny_model_dir), tmp_path, str(result), ASYNC),
        nprocs=2,
        join=True,
    )
    saved = torch.load(result)
    two = saved["two"]
    for n in two:  # the exact resume of the async path on 2 ranks: bit for bit
        assert torch.equal(two[n], saved["resumed"][n]), n
    volatile = ("time/", "tokens_per_second", "rollout/tokens_per_second")
    assert [{k: v for k, v in m.items() if not k.startswith(volatile)} for m in steps(tmp_path / "cut")] == [
        {k: v for k, v in m.items() if not k.startswith(volatile)} for m in steps(tmp_path / "two")
    ]
    one = run(tiny_model_dir, tmp_path / "one", ASYNC)
    for n in one:  # the ranks sum their gradients in another order than one process: float noise only
        assert torch.allclose(one[n], two[n], atol=1e-6, rtol=1e-5), (n, (one[n] - two[n]).abs().max().item())
    m1, m2 = steps(tmp_path / "one"), steps(tmp_path / "two")
    assert len(m1) == len(m2) == 3
    for a, b in zip(m1, m2):
        for key in KEYS:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        # a token mean of each rank, weighted by the ranks' tokens (record/rank_reduction.py): the job's, as one process
        # (before: the plain mean of the ranks' means, equal only within 1e-2)
        assert a["tis/logp_abs_diff_mean"] == pytest.approx(b["tis/logp_abs_diff_mean"], rel=1e-4, abs=1e-6)
        assert b["time/waiting_for_stragglers"] >= 0
    assert [m["rollout/staleness"] for m in m2] == [0, 1, 1]  # the rule: min(j, s) updates old
    assert m2[2]["tis/logp_abs_diff_mean"] > 1e-2  # a stale batch: the weights version shows in the ratio

    # guard: sampled synchronously (every batch by the newest weights) the same run ends elsewhere, so the
    # equality above checks that each rank samples with the schedule's version
    sync = run(tiny_model_dir, tmp_path / "sync", {**ASYNC, "rollout.async_staleness": 0})
    assert max((sync[n] - one[n]).abs().max().item() for n in one) > 1e-4


# ------------------------------------------------------------------ a rank's sampler that dies or hangs


def _hanging_worker(rank, world, init_file, model_dir, out):
    """Rank 1's sampler hangs on its second batch (a sleep no deadline of its own ends)."""
    import time

    import grpokit.rollout.engine as engine_mod

    calls = []

    def hang_on_rank_1(model, prompt_ids, group_size, params, **kw):
        calls.append(1)
        if rank == 1 and len(calls) > 1:
            time.sleep(600)
        return scripted_generate(model, prompt_ids, group_size, params, **kw)

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    engine_mod.generate = hang_on_rank_1
    from helpers.runs import make

    try:
        make(model_dir, out / f"r{rank}", **{**ASYNC, "rollout.async_timeout_s": 2}).train()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_rank_whose_sampler_hangs_stops_the_run_in_one_sentence_naming_it(tiny_model_dir, tmp_path):
    """Rank 1 misses rollout.async_timeout_s and stops with a sentence naming it, long before the
    collective's own timeout (120 s): the other rank is not left waiting in its barrier."""
    import time

    t0 = time.monotonic()
    with pytest.raises(mp.ProcessRaisedException) as info:
        mp.spawn(_hanging_worker, args=(2, str(tmp_path / "init"), str(tiny_model_dir), tmp_path), nprocs=2, join=True)
    assert time.monotonic() - t0 < 100
    msg = str(info.value)
    assert "RolloutWorkerError: the background rollout thread of rank 1 did not finish batch 1" in msg, msg[-800:]
    assert "rollout.async_timeout_s=2 s" in msg


def test_a_dead_sampler_thread_names_its_rank(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from grpokit.rollout.async_ import AsyncRollout
    from grpokit.rollout.engine import HFEngine

    def dies(sampler, prompts):
        raise ValueError("boom")

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    hf = HFEngine(eos_token_ids={0}, pad_token_id=0, decode=str, generator=torch.Generator())
    eng = AsyncRollout(
        model, 0, dies, lambda n: list(range(n)), hf=hf, prompts_per_step=4, group_size=2, max_staleness=1,
        device=torch.device("cpu"), seed=1, timeout_s=30, rank=1, world_size=2,
    )  # fmt: skip
    try:
        with pytest.raises(RuntimeError, match=r"the background rollout thread of rank 1 failed: ValueError\('boom'\)"):
            eng.prefetched(2, 2)
        assert eng.plan.local(0) == [2, 3]  # rank 1 of 2: the second half of the global prompts
    finally:
        eng.close()


# ------------------------------------------------------------------ worker processes on several ranks


def _thread_and_workers(rank, world, init_file, model_dir, out, port):
    """Real sampling: each rank's thread, then each rank's rollout worker process, then each rank's remote
    worker (listening on ``port`` + rank), on the same schedule."""
    from helpers.runs import make

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        got = {}
        remote = {"rollout.async_remote_workers": 1, "rollout.async_listen": f"127.0.0.1:{port}"}
        for name, extra in (("thread", {}), ("workers", {"rollout.async_workers": 1}), ("remote", remote)):
            tr = make(model_dir, out / name, **{**ASYNC, "train.steps": 2, **extra})
            tr.train()
            got[name] = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
        if rank == 0:
            torch.save(got, out / "rank0.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_rollout_workers_on_two_ranks_sample_what_the_threads_sample(tiny_model_dir, tmp_path, monkeypatch):
    """rollout.async_workers=1 on each of 2 ranks: a worker process per rank samples that rank's slice with
    that rank's seed, so the run equals the 2-rank thread run bit for bit (real sampling, no script); so does
    a remote worker per rank (rollout.async_remote_workers=1, rank r listening on the port + r)."""
    from helpers.net import free_port
    from helpers.rollout_workers import KEY, remote_worker

    monkeypatch.setenv("GRPOKIT_ROLLOUT_KEY", KEY)
    port = free_port()
    workers = [remote_worker(port + r, KEY, threads=1) for r in range(2)]
    try:
        args = (2, str(tmp_path / "init"), str(tiny_model_dir), tmp_path, port)
        mp.spawn(_thread_and_workers, args=args, nprocs=2, join=True)
        codes = [w.wait(60) for w in workers]
    finally:
        for w in workers:
            w.kill()  # a no-op for one that ended
    got = torch.load(tmp_path / "rank0.pt")
    for n in got["thread"]:
        assert torch.equal(got["thread"][n], got["workers"][n]), n
        assert torch.equal(got["thread"][n], got["remote"][n]), n
    assert steps(tmp_path / "workers")[1]["rollout/staleness"] == 1
    assert codes == [0, 0]  # each served its rank and was told to stop


def test_fsdp_with_async_is_refused_in_one_sentence(monkeypatch):
    from grpokit.config import Config, ConfigError
    from grpokit.train.distributed import DistContext
    from grpokit.train.world_check import check_world

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # as under torchrun
    cfg = Config()
    cfg.train.fsdp, cfg.train.prompts_per_step, cfg.rollout.async_staleness = True, 4, 1
    for k in (1, 2):
        with pytest.raises(ConfigError, match=r"rollout.async_staleness=1 does not run with train.fsdp=true"):
            check_world(cfg, DistContext(world_size=k, fsdp=True))
    cfg.train.fsdp = False
    check_world(cfg, DistContext(world_size=2))  # async on 2 data-parallel ranks: accepted
