"""Asynchronous rollout with bounded staleness: sample step k+1 while step k trains.

A background thread samples batches with *snapshots* of the policy (frozen copies, so the update can
change the live weights underneath without tearing a generation). After every update the trainer
publishes a new snapshot; its version is the number of updates it contains.

The bound and the schedule are rollout/async_plan.py's one rule: batch j is trained by step j and
sampled by the snapshot of version ``max(0, j - max_staleness)`` with its own generator, seeded by
(seed, j), on prompts the trainer's thread drew for it. With max_staleness = 1 sampling of step k+1
overlaps the update of step k, the classic one-step-off pipeline. Because nothing depends on timing,
a checkpoint holds the in-flight batches' prompts and older snapshots (``state_dict``) and a resumed
run equals the uninterrupted one bit for bit on CPU.

Stale samples are off-policy: the trainer applies truncated importance sampling (pi_old / pi_sampler,
tis.py, ``rollout.tis_cap``) and, if set, off-policy sequence masking (``algo.offpolicy_delta``).
Each token of a taken batch carries the version that drew it, and ``rollout/staleness`` is computed from
the batch the step trains (rollout/staleness.py: a refill sampled on the trainer's model counts 0).
A snapshot shares the live model's frozen parameters (nn/models.py ``sampling_snapshot``): with LoRA only the
adapters are copied, and ``rollout/weight_sync_bytes`` says how many bytes each sync moved.
rollout/async_process.py runs the same schedule in worker processes (``rollout.async_workers``). With
``partial_tokens`` > 0 a batch's decode picks up newer versions every that many tokens (rollout/partial.py's rule).

Several trainer ranks: each rank runs its own thread on its own snapshots and samples its slice of the
global prompts (async_plan.py). The thread never calls a collective; the trainer's thread waits for its
batch with a deadline (``timeout_s``: a dead or hung sampler stops the run in one sentence naming the rank,
before the other ranks' collectives could time out) and then for the other ranks (``wait_ranks``, a
barrier: ``time/waiting_for_stragglers``).

On CUDA the thread decodes on a stream of its own, so its kernels run beside the update's instead of
queueing behind them on the default stream, and the static engine replays CUDA graphs captured on that
stream (rollout/step_graphs.py: ``thread_local`` capture, no device-wide synchronisation). Each
snapshot is copied on the trainer's stream; the sampler's stream waits for an event recorded after the
copy (``_Published``) and is synchronised before it lets go of a snapshot, whose memory the trainer's
stream may then reuse.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import weakref
from typing import Callable

import torch

from .async_plan import AsyncPlan, batch_generator
from .async_workers import RolloutWorkerError
from .engine import HFEngine, TurnSampler
from .partial import generate_partial, segment_version
from .staleness import arrived


def _closer(ref: weakref.ref) -> Callable[[], None]:
    """An exit hook that closes the sampler ``ref`` points to, if it still lives. A process that ends with
    the sampler thread inside a decode (a script calling ``train_step`` and returning without ``close``)
    was aborted by the C++ runtime ("terminate called without an active exception"); closed first, the
    thread finishes its batch and ends."""

    def close_at_exit() -> None:
        engine = ref()
        if engine is not None:
            engine.close()

    return close_at_exit


class _Published:
    """Where the sampler's CUDA stream meets the trainer's: ``mark()`` (trainer's thread, after a snapshot's
    copy is queued) records an event on the trainer's stream; ``take(event)`` (sampler's thread, before it
    samples with a snapshot) finishes its own stream's queued work (``finish``), so the snapshot it drops
    next is no longer read, and makes its stream wait for that mark. Nothing on a CPU, where work is
    synchronous."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.event = None
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            self.event = torch.cuda.Event()
            self.event.record()

    def finish(self) -> None:
        """Wait for the sampler stream's queued kernels (a decode may queue a step ahead of its last read)."""
        if self.cuda:
            self.stream.synchronize()

    def take(self, event) -> None:
        self.finish()
        if self.cuda:
            self.stream.wait_event(event)

    def on_stream(self):
        """The sampler thread's stream as its current one (CUDA), or nothing."""
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()


class _Stopped(Exception):
    """The run closed the sampler while a partial batch waited for a version."""


class _PartialJob:
    """The "model" of a partial batch: ``turn_sampler`` decodes it in segments, each on its version's snapshot."""

    def __init__(self, owner: "AsyncRollout", index: int, start: int):
        self.owner, self.index, self.start = owner, index, start
        self.waited = 0.0  # seconds spent waiting for unpublished versions: not sampling (time/sampling)
        self.held = None  # the last snapshot handed out, kept until the batch's kernels are done

    def version_model(self, segment: int) -> tuple[torch.nn.Module, int]:
        """Segment ``segment``'s snapshot and version, waiting until the trainer has published it."""
        v, own = segment_version(self.index, segment, self.start), self.owner
        t0 = time.perf_counter()
        with own.cond:
            own.cond.wait_for(lambda: own.stopped or v in own.plan.snapshots)
            self.waited += time.perf_counter() - t0
            if own.stopped:
                raise _Stopped
            snapshot, event = own.plan.snapshots[v], own.published.event
        own.published.take(event)
        self.held = snapshot
        return snapshot, v


class AsyncRollout:
    """A RolloutEngine (rollout/engine.py) that prefetches: the first batch of the step's size in a step
    comes from the background thread; anything else (a refill) is sampled on the trainer's model by
    ``hf``, the engine the thread samples its snapshots with."""

    def __init__(
        self,
        model,
        step: int,
        sample: Callable,
        next_batch: Callable[[int], list],
        *,
        hf: HFEngine,
        prompts_per_step: int,
        group_size: int,
        max_staleness: int,
        device: torch.device,
        seed: int,
        resume_state: dict | None = None,
        partial_tokens: int = 0,
        timeout_s: float = 0.0,
        rank: int = 0,
        world_size: int = 1,
        wait_ranks: Callable[[], None] = lambda: None,
    ):
        """``model`` is the policy after ``step`` updates; ``sample(turn_sampler, prompts)`` runs one
        batch's episodes (the trainer's own episode loop) with this engine's turn sampler, ``next_batch(n)``
        draws n fresh global prompts (``prompts_per_step``: every rank's), ``seed`` is this rank's,
        ``resume_state`` is a checkpoint's ``state_dict()``, ``partial_tokens`` is rollout.async_partial_tokens,
        ``timeout_s`` (rollout.async_timeout_s; 0: none) bounds the wait for a batch and ``wait_ranks``
        returns once every rank has its batch."""
        self.sample, self.hf, self.device, self.seed = sample, hf, device, seed
        self.partial_tokens, self.timeout_s, self.rank, self.wait_ranks = partial_tokens, timeout_s, rank, wait_ranks
        self.world_size = world_size
        self.n, self.G, self.max_staleness = prompts_per_step // world_size, group_size, max_staleness
        self.cond = threading.Condition()
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
        self.trainer_step = step  # updates the trainer has made (after_update tells it each new one)
        self.taken = -1  # the last step whose batch prefetched handed out
        self.ready: dict[int, tuple] = {}  # batch index -> (rollout, version, seconds spent sampling it)
        self.log: list[tuple[int, int]] = []  # (batch index, snapshot version) of every produced batch
        self.waited = 0.0  # seconds the last take waited for its batch
        self.sampled = 0.0  # seconds the sampler spent on the last taken batch (time/sampling)
        self.straggled = 0.0  # seconds the last take waited for the other ranks' batches
        self.error: BaseException | None = None
        self.stopped = self.hung = False
        self.published = _Published(device)  # after the first snapshot's copy
        self.thread = threading.Thread(target=self._produce, name="grpokit-async-rollout", daemon=True)
        self.thread.start()
        self._at_exit = _closer(weakref.ref(self))
        atexit.register(self._at_exit)

    def _produce(self) -> None:
        try:
            with self.published.on_stream():
                self._produce_batches()
        except _Stopped:
            return
        except BaseException as e:  # surfaced in the trainer's thread by prefetched
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def _produce_batches(self) -> None:
        i = self.trainer_step
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.stopped or self.plan.has_job(i))
                if self.stopped:
                    return
                model, version, prompts = self.plan.job(i)
                event = self.published.event
            self.published.take(event)
            if self.partial_tokens:  # turn_sampler decodes it in segments
                model = _PartialJob(self, i, version)
            t0 = time.perf_counter()
            ro = self.sample(self.turn_sampler(model, batch_generator(self.seed, i, self.device)), prompts)
            self.published.finish()  # before the loop lets go of this batch's snapshot
            busy = time.perf_counter() - t0 - (model.waited if isinstance(model, _PartialJob) else 0.0)
            with self.cond:
                self.ready[i] = (ro, version, busy)
                self.log.append((i, version))
                self.cond.notify_all()
            i += 1

    def prefetched(self, n: int, group_size: int):
        """``(prompts, rollout)`` of this step's batch, waiting for the producer if needed; None for a
        batch of another size or a second call in the step (a refill: the trainer samples it itself)."""
        k = self.trainer_step
        if n != self.n or group_size != self.G or self.taken == k:
            return None
        t0 = time.perf_counter()
        with self.cond:
            got = self.cond.wait_for(lambda: k in self.ready or self.error is not None, self.timeout_s or None)
            if self.error is not None:
                raise RuntimeError(f"{self._who()} failed: {self.error!r}") from self.error
            if not got:
                self.hung = True
                raise RolloutWorkerError(
                    f"{self._who()} did not finish batch {k} within rollout.async_timeout_s={self.timeout_s:g} s "
                    "(hung or too slow; raise rollout.async_timeout_s if it is only slow)"
                )
            ro, version, self.sampled = self.ready.pop(k)
            prompts = self.plan.local(k)
        t1 = time.perf_counter()
        self.wait_ranks()  # every rank has its batch: the step's collectives cannot wait on a missing sampler
        self.taken, self.waited, self.straggled = k, t1 - t0, time.perf_counter() - t1
        return prompts, arrived(ro, k, version, self.max_staleness)  # each token's version (rollout/staleness.py)

    def after_update(self, model, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        with self.cond:  # the snapshot is copied under the lock: the plan's dicts are the producer's too
            self.plan.check_taken(self.taken, step)
            self.plan.publish(model, step)
            self.published.mark()
            self.cond.notify_all()
        self.trainer_step = step
        return {
            "rollout/weight_sync_bytes": float(self.plan.sync_bytes),
            "time/weight_sync": time.perf_counter() - t0,
            "time/sampling": self.sampled,
            "time/waiting_for_rollout": self.waited,
            "time/waiting_for_stragglers": self.straggled,
        }

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the sampler (rollout/async_plan.py)."""
        with self.cond:
            return self.plan.state_dict()

    def turn_sampler(self, model, generator: torch.Generator | None = None) -> TurnSampler:
        if isinstance(model, _PartialJob):
            return self._partial_sampler(model, generator)
        return self.hf.turn_sampler(model, generator)  # explicit prompts (GFPO refills): the trainer's own model

    def _partial_sampler(self, job: _PartialJob, generator: torch.Generator) -> TurnSampler:
        hf = self.hf

        def sample(contexts, group_size: int, params, images=None, **kw):
            if images is not None or kw:  # validation refuses these configurations; a caller's bug otherwise
                raise ValueError("rollout.async_partial_tokens decodes text prompts only, not image prompts")
            return generate_partial(
                job.version_model,
                contexts,
                group_size,
                params,
                self.partial_tokens,
                eos_token_ids=hf.eos_token_ids,
                pad_token_id=hf.pad_token_id,
                generator=generator,
                decode=hf.decode,
                engine=hf.decoder,
            )

        return sample

    def _who(self) -> str:
        return "the background rollout thread" + (f" of rank {self.rank}" if self.world_size > 1 else "")

    def finish_sampling(self) -> None:
        pass

    def sleep_for_update(self) -> None:
        pass

    def close(self) -> None:
        atexit.unregister(self._at_exit)
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join(timeout=0 if self.hung else 60)  # a hung thread (a daemon) is left to the exit
