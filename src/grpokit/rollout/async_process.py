"""Asynchronous rollout in worker processes (``rollout.async_workers = N``): rollout/async_.py's schedule,
sampled by N spawned processes (rollout/async_workers.py) instead of a thread of the trainer.

The schedule is rollout/async_plan.py's, unchanged: batch j is sampled by version ``max(0, j - s)`` with
the generator of (seed, j) on prompts the trainer drew, whichever worker takes it, so N workers, one
worker or the thread give the same batches, a dropped worker's batch redone elsewhere is the same batch,
and a checkpoint resumes exactly. Weights travel as shared-memory tensors: each published snapshot's
trainable tensors are moved to shared memory once (``share_memory_``) and each job carries their handles;
with LoRA those are the adapters. The frozen tensors are shared once, at the workers' start.

Partial rollouts (``rollout.async_partial_tokens`` = K): a worker decodes batch j in segments of K tokens,
segment m drawn by version ``min(j - s + m, j)`` (rollout/partial.py's rule, the thread's ``generate_partial``
call), so its batches equal the thread's bit for bit. A job carries the versions it needs that are published;
each later one is pushed to the workers that need it when the trainer publishes it (async_workers.py).

Several trainer ranks: each rank has its own pool sampling its slice of the global prompts with its own
seed (async_plan.py); ``time/waiting_for_stragglers`` adds the wait for the other ranks' batches.

Devices (``rollout.async_worker_device``): the workers sample on the trainer's own device by default, or on
another (the CPU, or a second card). The snapshots stay on the trainer's device: on a card the pipe carries their
CUDA IPC handles instead of shared-memory ones (torch.multiprocessing's reductions), the frozen tensors too, and
a worker on another device copies each version across into its own parameters (its policy moved there at its
start). Its generator lives on its own device (async_plan.batch_generator), as the thread's on the trainer's, so
a worker on the trainer's device draws the thread's batches; on a card it replays its decode's CUDA graphs
(``rollout.cuda_graphs``; partial rollouts decode eagerly).

What it does not do (refused in one sentence by validation): multi-turn episodes (tools, environments),
image prompts, the vLLM backends (they have their own engine processes).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from grpokit.config.base import ConfigError
from grpokit.nn import kernels
from grpokit.types import Rollout

from .async_plan import AsyncPlan
from .async_remote import host_record
from .async_workers import START_S, Job, WorkerPool
from .engine import HFEngine, TurnSampler
from .hf import SamplingParams, generate
from .partial import generate_partial, segment_version
from .staleness import arrived


@dataclass(frozen=True)
class SampleContext:
    """What a worker needs to sample a batch as the trainer's hf engine would (one turn, no tools)."""

    group_size: int
    params: SamplingParams
    eos_token_ids: frozenset
    pad_token_id: int
    decoder: str
    tokenizer: object  # for stop strings' decoding
    partial_tokens: int = 0  # rollout.async_partial_tokens (0: whole batches by one version)
    cuda_graphs: bool = False  # rollout.cuda_graphs: a worker on a card replays its whole-batch decode's graphs

    def needs(self, index: int, start: int) -> tuple[int, ...]:
        """The versions after ``start`` that batch ``index``'s segments are drawn by (partial rollouts)."""
        if not self.partial_tokens:
            return ()
        segments = -(-self.params.max_new_tokens // self.partial_tokens)
        return tuple(sorted({segment_version(index, m, start) for m in range(segments)} - {start}))


def sample_one_turn(ctx: SampleContext, model, generator: torch.Generator, prompts: list) -> Rollout:
    """A worker's batch: G completions per prompt in one batched decode, the trainer's own call. With
    ``ctx.partial_tokens`` > 0 ``model`` is a function ``segment -> (policy, version)`` and the batch is
    decoded in segments, as the sampler thread decodes it (rollout/async_.py)."""
    ids = [p.ids for p in prompts]
    decode = None if ctx.tokenizer is None else lambda t: ctx.tokenizer.decode(t, skip_special_tokens=True)
    kw = dict(eos_token_ids=set(ctx.eos_token_ids), pad_token_id=ctx.pad_token_id, generator=generator, decode=decode)
    with torch.no_grad():
        if ctx.partial_tokens:
            return generate_partial(
                model, ids, ctx.group_size, ctx.params, ctx.partial_tokens, engine=ctx.decoder, **kw
            )
        graphs = ctx.cuda_graphs and next(model.parameters()).is_cuda
        return generate(model, ids, ctx.group_size, ctx.params, engine=ctx.decoder, cuda_graphs=graphs, **kw)


@contextlib.contextmanager
def sendable(model: torch.nn.Module, setting: str = "rollout.async_workers"):
    """``model`` without what pickle cannot name and the worker sets again on its copy: the per-module ``forward``
    of oneDNN routing, the methods liger-kernel binds to its modules (model.kernels), and the INERT_HOOKS; yields
    ``{"onednn": ..., "liger": ...}``, whether there were any, for the worker to patch its copy the same way. Any
    other replaced forward is refused in one sentence naming ``setting``: the worker could not rebuild it."""
    bound = [(m, k) for m in model.modules() for k, v in vars(m).items() if _liger_method(v)]
    liger = {id(m) for m, k in bound if k == "forward"}
    replaced = [m for m in model.modules() if "forward" in vars(m) and id(m) not in liger]
    other = [type(m).__name__ for m in replaced if not kernels.is_routed(m)]
    if other:
        raise ConfigError(
            f"{setting} cannot send a model whose {other[0]} has a replaced forward "
            f"(model.lm_head_fp32, NEFTune, ...); set {setting}=0"
        )
    saved = [(m, "forward", vars(m).pop("forward")) for m in replaced] + [(m, k, vars(m).pop(k)) for m, k in bound]
    inert = [(m, k, m._forward_hooks.pop(k)) for m in model.modules() for k, h in list(m._forward_hooks.items())
             if getattr(h, "__qualname__", "").startswith(INERT_HOOKS)]  # fmt: skip
    try:
        yield {"onednn": bool(replaced), "liger": bool(bound)}
    finally:
        for m, k, method in saved:
            vars(m)[k] = method
        for m, k, h in inert:
            m._forward_hooks[k] = h


def _liger_method(value) -> bool:
    """Whether an instance attribute is a method liger-kernel bound to its module (its forward, its name)."""
    return getattr(getattr(value, "__func__", None), "__module__", "").startswith("liger_kernel.")


INERT_HOOKS = ("PreTrainedModel.enable_input_require_grads.",)
"""Forward hooks a worker's copy goes without: transformers' gradient checkpointing (model.gradient_checkpointing, or
train.memory_plan turning it on) hooks the input embeddings to make their output require a gradient, a local
function pickle cannot name and a no-op under the sampler's no_grad."""


def check_rollout(job: Job, ro, group_size: int, vocab_size: int) -> str:
    """Why a worker's answer is not a batch of this job (empty: it is): the rows, the prompts, the
    token ids, the sampling log-probabilities."""
    if not isinstance(ro, Rollout):
        return f"a {type(ro).__name__}, not a Rollout"
    n = len(job.prompts) * group_size
    if not (len(ro.completion_ids) == len(ro.sampling_logprobs) == len(ro.finish_reasons) == n):
        return f"{len(ro.completion_ids)} completions where {n} were asked"
    if [list(p) for p in ro.prompt_ids] != [list(p.ids) for p in job.prompts]:
        return "prompts other than the job's"
    for ids, lps in zip(ro.completion_ids, ro.sampling_logprobs):
        if len(ids) != len(lps):
            return "a completion whose log-probabilities do not match its tokens"
        if any(not isinstance(t, int) or not 0 <= t < vocab_size for t in ids):
            return f"a token id outside the vocabulary [0, {vocab_size})"
        if any(not (math.isfinite(x) and x <= 1e-6) for x in lps):
            return "a sampling log-probability that is not a finite number <= 0"
    return ""


class ProcessRollout:
    """The RolloutEngine of ``rollout.async_workers``: AsyncRollout's schedule and checkpoint state, its
    batches sampled by a WorkerPool; refills (a second batch in a step) are sampled on the trainer's model."""

    def __init__(
        self,
        model,
        step: int,
        next_batch: Callable[[int], list],
        *,
        hf: HFEngine,
        context: SampleContext,
        workers: int,
        device: torch.device = torch.device("cpu"),
        threads: int = 0,
        timeout_s: float,
        on_fault: str,
        prompts_per_step: int,
        max_staleness: int,
        seed: int,
        resume_state: dict | None = None,
        sample: Callable = sample_one_turn,
        rank: int = 0,
        world_size: int = 1,
        wait_ranks: Callable[[], None] = lambda: None,
        remote=None,
        kernels: Callable | None = None,
    ):
        """``sample(context, model, generator, prompts) -> Rollout`` runs in each worker (a module-level function:
        the workers import it); ``device`` where the local workers sample (the snapshots, on the trainer's device,
        reach them as shared memory or CUDA IPC handles); ``threads`` each worker's intra-op threads (0: the
        trainer's); ``prompts_per_step`` is the global batch, ``seed`` this rank's, ``wait_ranks`` returns once
        every rank has its batch (async_.py); ``remote``: the workers on other hosts to wait for
        (rollout/async_remote.py RemoteWorkers), numbered after the local ones; ``kernels(model, device)``
        patches a worker's copy on a card with liger-kernel's kernels where the trainer's model has them
        (train/liger.py; a module-level function the workers import)."""
        self.hf, self.n, self.G, self.context = hf, prompts_per_step // world_size, context.group_size, context
        self.max_staleness, self.wait_ranks = max_staleness, wait_ranks
        self.plan = AsyncPlan(
            model,
            step,
            next_batch,
            prompts_per_step=prompts_per_step,
            max_staleness=max_staleness,
            seed=seed,
            state=resume_state,
            rank=rank,
            world_size=world_size,
        )
        self.trainer_step, self.taken, self.waited, self.straggled = step, -1, 0.0, 0.0
        self.sampled = 0.0  # seconds the worker spent on the last taken batch (time/sampling)
        vocab = model.get_input_embeddings().num_embeddings
        init = self._init_record(sample, seed, threads, device)
        joined = remote.join(workers, max(timeout_s, START_S), timeout_s) if remote else []
        setting = "rollout.async_workers" if workers else "rollout.async_remote_workers"
        with sendable(init["model"], setting) as patched:  # the workers pickle it at their start
            init.update(onednn=patched["onednn"], kernels=kernels if patched["liger"] else None)
            self.pool = WorkerPool(
                workers,
                init,
                timeout_s=timeout_s,
                on_fault=on_fault,
                check=lambda job, ro: check_rollout(job, ro, self.G, vocab),
                remote=joined,
                remote_init=host_record(init) if joined else None,
            )
        self.local_workers = workers
        self.submitted: set[int] = set()
        self._submit_ready()

    def _init_record(self, sample: Callable, seed: int, threads: int, device: torch.device) -> dict:
        """What every worker receives at its start (rollout/async_worker.py worker_main); a remote worker's is a copy
        with the policy on the CPU and its own device (rollout/async_remote.py)."""
        return {
            "device": str(device),
            "model": self.plan.snapshots[min(self.plan.snapshots)],
            "sample": sample,
            "context": self.context,
            "trainable": self.plan.trainable,
            "seed": seed,
            "threads": threads or torch.get_num_threads(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "partial": bool(self.context.partial_tokens),
        }

    def _submit_ready(self) -> None:
        """Every batch whose prompts and weights exist goes to the pool (at most s + 1 at a time)."""
        for j in sorted(self.plan.prompts):
            if j not in self.submitted and self.plan.has_job(j):
                _, v, prompts = self.plan.job(j)
                needs = self.context.needs(j, v)
                later = {u: self._tensors(u) for u in needs if u in self.plan.snapshots}
                self.pool.submit(Job(j, v, self._tensors(v), prompts, needs, later))
                self.submitted.add(j)

    def _tensors(self, version: int) -> dict[str, torch.Tensor]:
        """Version ``version``'s trainable tensors, in shared memory (moved there once) where local workers get
        their handles; remote workers get their bytes through their pairs (rollout/async_remote.py), so a pool of
        remote workers only leaves them where they are (moving SmolLM2's 540 MB took 0.4 s a version)."""
        params = dict(self.plan.snapshots[version].named_parameters())
        tensors = {name: params[name].data for name in self.plan.trainable}
        if self.local_workers:
            tensors = {name: t.share_memory_() for name, t in tensors.items()}
        return tensors

    def prefetched(self, n: int, group_size: int):
        k = self.trainer_step
        if n != self.n or group_size != self.G or self.taken == k:
            return None
        t0 = time.perf_counter()
        ro, self.straggled = self.pool.result(k)
        t1 = time.perf_counter()
        self.wait_ranks()
        self.taken, self.waited = k, t1 - t0
        self.sampled = self.pool.sampled_s.pop(k, math.nan)
        self.straggled += time.perf_counter() - t1
        return self.plan.local(k), arrived(ro, k, self.plan.version_for(k), self.max_staleness)  # rollout/staleness.py

    def after_update(self, model, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        self.plan.check_taken(self.taken, step)
        self.plan.publish(model, step)
        self.trainer_step = step
        if self.context.partial_tokens:  # batches in flight may wait for it at a segment boundary
            self.pool.push(step, self._tensors(step))
        self._submit_ready()
        sync = time.perf_counter() - t0 + self.pool.sync_s
        self.pool.sync_s = 0.0
        self.submitted = {j for j in self.submitted if j >= step}
        return {
            "rollout/weight_sync_bytes": float(self.plan.sync_bytes),
            "rollout/worker_faults": float(self.pool.stats.faults),
            "rollout/workers": float(len(self.pool.workers)),
            "time/weight_sync": sync,
            "time/sampling": self.sampled,
            "time/waiting_for_rollout": self.waited,
            "time/waiting_for_stragglers": self.straggled,
        }

    def state_dict(self) -> dict:
        return self.plan.state_dict()

    def turn_sampler(self, model, generator: torch.Generator | None = None) -> TurnSampler:
        return self.hf.turn_sampler(model, generator)

    def finish_sampling(self) -> None:
        pass

    def sleep_for_update(self) -> None:
        pass

    def close(self) -> None:
        self.pool.close()
