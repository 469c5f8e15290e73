"""Asynchronous rollout with bounded staleness: sample step k+1 while step k trains.

A background thread samples batches with a *snapshot* of the policy (a frozen copy, so the update
can change the live weights underneath without tearing a generation). After every update the
trainer publishes a new snapshot; its version is the number of updates it contains.

The bound. Batch i is consumed by step i. The producer may start batch i only once a snapshot of
version v >= i - max_staleness is published, so when step i trains on it the sample is at most
``i - v <= max_staleness`` updates old. With max_staleness = 1 sampling of step k+1 overlaps the
update of step k, the classic one-step-off pipeline.

Stale samples are off-policy: the trainer applies truncated importance sampling (pi_old / pi_sampler,
tis.py, ``rollout.tis_cap``) and, if set, off-policy sequence masking (``algo.offpolicy_delta``).
The staleness of every consumed batch is reported as ``rollout/staleness``. A snapshot shares the live
model's frozen parameters (nn/models.py ``sampling_snapshot``): with LoRA only the adapters are copied, and
``rollout/weight_sync_bytes`` says how many bytes each sync moved.

Limits: the producer has its own sampling generator and consumes prompts ahead of the trainer, so a
resumed run does not reproduce an uninterrupted one bit for bit; single process only.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch

from grpokit.nn.models import sampling_snapshot

from .engine import HFEngine, TurnSampler


class AsyncRollout:
    """A RolloutEngine (rollout/engine.py) that prefetches: batches of the step's size come from the
    background thread; anything else (a refill of other prompts) is sampled on the trainer's model by
    ``hf``, the engine the thread samples its snapshot with."""

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
    ):
        """``model`` is the policy after ``step`` updates; ``sample(model, generator, prompts)`` runs one
        batch's episodes (the trainer's own episode loop) and ``next_batch(n)`` draws n fresh prompts."""
        self.sample, self.next_batch, self.max_staleness, self.hf = sample, next_batch, max_staleness, hf
        self.n, self.G = prompts_per_step, group_size
        self.generator = torch.Generator(device=device).manual_seed(seed + 1)
        self.trainer_step = step  # updates the trainer has made (after_update tells it each new one)
        self.cond = threading.Condition()
        self.version, (self.snapshot, self.sync_bytes) = step, sampling_snapshot(model)
        self.ready: dict[int, tuple] = {}  # batch index -> (prompts, rollout, version)
        self.consumed = step  # index of the next batch the trainer takes
        self.log: list[tuple[int, int]] = []  # (batch index, snapshot version) of every produced batch
        self.last_staleness = 0
        self.error: BaseException | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self._produce, name="grpokit-async-rollout", daemon=True)
        self.thread.start()

    def _produce(self) -> None:
        i = self.consumed
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: self.stopped or self.version >= i - self.max_staleness)
                    if self.stopped:
                        return
                    model, version = self.snapshot, self.version
                prompts = self.next_batch(self.n)
                ro = self.sample(model, self.generator, prompts)
                with self.cond:
                    self.ready[i] = (prompts, ro, version)
                    self.log.append((i, version))
                    self.cond.notify_all()
                i += 1
        except BaseException as e:  # surfaced in the trainer's thread by prefetched
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def prefetched(self, n: int, group_size: int):
        """``(prompts, rollout)`` of the next batch, waiting for the producer if needed; None for a
        batch of another size (a refill: the trainer draws and samples it itself)."""
        if n != self.n or group_size != self.G:
            return None
        with self.cond:
            self.cond.wait_for(lambda: self.consumed in self.ready or self.error is not None)
            if self.error is not None:
                raise RuntimeError(f"the background rollout thread failed: {self.error!r}") from self.error
            prompts, ro, version = self.ready.pop(self.consumed)
            self.consumed += 1
        self.last_staleness = self.trainer_step - version
        return prompts, ro

    def after_update(self, model, step: int) -> dict[str, float]:
        # copied outside the lock: the producer keeps sampling meanwhile; with LoRA only the adapters travel
        snap, self.sync_bytes = sampling_snapshot(model)
        with self.cond:
            self.snapshot, self.version = snap, step
            self.cond.notify_all()
        self.trainer_step = step
        return {"rollout/staleness": float(self.last_staleness), "rollout/weight_sync_bytes": float(self.sync_bytes)}

    def turn_sampler(self, model, generator: torch.Generator | None = None) -> TurnSampler:
        return self.hf.turn_sampler(model, generator)  # explicit prompts (GFPO refills): the trainer's own model

    def finish_sampling(self) -> None:
        pass

    def sleep_for_update(self) -> None:
        pass

    def close(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join(timeout=60)
