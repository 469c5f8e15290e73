"""Rollout worker processes for tests (rollout/async_process.py): a tiny policy's ProcessRollout, the batch a
worker must return, and a worker's sample function that returns garbage (module-level: the workers import it)."""

import copy
import dataclasses
import os
import subprocess
import sys

import torch

from grpokit.rollout.async_plan import batch_generator
from grpokit.rollout.async_process import ProcessRollout, SampleContext, sample_one_turn
from grpokit.rollout.async_remote import RemoteWorkers
from grpokit.rollout.engine import HFEngine
from grpokit.rollout.hf import SamplingParams
from grpokit.types import Prompt
from helpers.models import tiny_qwen2

SEED = 7
CONTEXT = SampleContext(
    group_size=3,
    params=SamplingParams(max_new_tokens=8),
    eos_token_ids=frozenset({2}),
    pad_token_id=0,
    decoder="auto",
    tokenizer=None,
)


def garbage_sample(ctx, model, generator, prompts):
    """A batch of the right shape whose first token lies outside any vocabulary."""
    ro = sample_one_turn(ctx, model, generator, prompts)
    ids = [list(c) for c in ro.completion_ids]
    ids[0][0] = 10**6
    return dataclasses.replace(ro, completion_ids=ids)


def prompt_source():
    """``next_batch(n)``: n prompts of a fixed sequence (a fresh source starts it again)."""
    counter = iter(range(10**6))
    return lambda n: [Prompt(text="", ids=[1, 5 + next(counter) % 20, 6]) for _ in range(n)]


def tiny_hf_engine() -> HFEngine:
    return HFEngine(eos_token_ids={2}, pad_token_id=0, decode=None, generator=torch.Generator().manual_seed(0))


def process_engine(
    workers: int,
    on_fault: str = "stop",
    timeout_s: float = 60.0,
    sample=sample_one_turn,
    model=None,
    staleness: int = 1,
    partial_tokens: int = 0,
    remote: int = 0,
    port: int = 0,
    device: torch.device = torch.device("cpu"),
    cuda_graphs: bool = False,
):
    """``(engine, model)``: a tiny policy's (or ``model``'s) ProcessRollout (2 prompts of 3 samples a step;
    ``partial_tokens``: rollout.async_partial_tokens); ``remote`` workers join at 127.0.0.1:``port`` with KEY
    (start them with ``remote_worker``); the local workers sample on ``device``, replaying CUDA graphs there
    where ``cuda_graphs``."""
    model = model if model is not None else tiny_qwen2(seed=1)
    engine = ProcessRollout(
        model,
        0,
        prompt_source(),
        hf=tiny_hf_engine(),
        context=dataclasses.replace(CONTEXT, partial_tokens=partial_tokens, cuda_graphs=cuda_graphs),
        workers=workers,
        device=device,
        timeout_s=timeout_s,
        on_fault=on_fault,
        prompts_per_step=2,
        max_staleness=staleness,
        seed=SEED,
        sample=sample,
        remote=RemoteWorkers(remote, ("127.0.0.1", port), KEY.encode()) if remote else None,
    )
    return engine, model


KEY = "test-rollout-key-0123456789"


def remote_worker(port: int, key: str = KEY, *args: str, threads: int = 0) -> subprocess.Popen:
    """A real ``grpokit rollout-worker`` process connecting to 127.0.0.1:``port`` (stderr piped), with
    ``threads`` intra-op threads (0: this process's): a worker's batches equal the trainer's own only under the
    trainer's thread count."""
    env = {**os.environ, "GRPOKIT_ROLLOUT_KEY": key}
    cmd = [sys.executable, "-m", "grpokit", "rollout-worker", "--connect", f"127.0.0.1:{port}"]
    cmd += ["--threads", str(threads or torch.get_num_threads()), *args]
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)


def expected_batch(engine, index: int, device: torch.device = torch.device("cpu")):
    """What any worker on ``device`` must return for batch ``index``: the schedule's snapshot (a copy on
    ``device``), prompts and generator."""
    snap, _, prompts = engine.plan.job(index)
    if next(snap.parameters()).device != device:
        snap = copy.deepcopy(snap).to(device)
    ro = sample_one_turn(CONTEXT, snap, batch_generator(SEED, index, device), prompts)
    return ro.completion_ids, ro.sampling_logprobs


SLOW_S = 0.4  # what slow_sample adds to a batch's sampling


def slow_sample(ctx, model, generator, prompts):
    """sample_one_turn after SLOW_S seconds of "decoding" (time/sampling must count them)."""
    import time

    time.sleep(SLOW_S)
    return sample_one_turn(ctx, model, generator, prompts)


def bump(model) -> None:
    """An update: the first trainable tensor moves, so the next version differs."""
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).add_(0.01)


def run_steps(engine, model, n: int, check: bool = True, device: torch.device = torch.device("cpu")):
    """n steps of the trainer's side: take the step's batch (where ``check``, equal to the schedule's on
    ``device``), update, publish; ``(batches, last metrics)``, each batch its tokens, log-probabilities and
    versions, the metrics the engine's and the batch's staleness (the trainer's rule, rollout/staleness.py)."""
    from grpokit.rollout.staleness import staleness_metrics

    got, metrics = [], None
    for k in range(n):
        want = expected_batch(engine, k, device) if check else None
        _, ro = engine.prefetched(2, 3)
        got.append((ro.completion_ids, ro.sampling_logprobs, ro.sampling_versions))
        assert not check or (ro.completion_ids, ro.sampling_logprobs) == want, k
        bump(model)
        metrics = {**engine.after_update(model, k + 1), **staleness_metrics(ro, k)}
    return got, metrics


def thread_batches(
    staleness: int, steps: int, partial_tokens: int = 0, device: torch.device = torch.device("cpu")
) -> list:
    """The sampler thread's batches (rollout/async_.py) of process_engine's policy and prompts on ``device``, steps
    0 to ``steps`` - 1: the reference worker processes must equal."""
    from grpokit.rollout.async_ import AsyncRollout

    model = tiny_qwen2(seed=1).to(device)
    engine = AsyncRollout(
        model,
        0,
        lambda sampler, prompts: sampler([p.ids for p in prompts], 3, CONTEXT.params),
        prompt_source(),
        hf=tiny_hf_engine(),
        prompts_per_step=2,
        group_size=3,
        max_staleness=staleness,
        device=device,
        seed=SEED,
        partial_tokens=partial_tokens,
    )
    try:
        return run_steps(engine, model, steps, check=False)[0]
    finally:
        engine.close()
