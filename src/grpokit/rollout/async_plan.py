"""Which prompts and which weights each asynchronous batch is sampled with, and what a checkpoint keeps.

The one rule. Batch j is trained by step j (the one after j steps) and is sampled by the policy after
exactly ``max(base, j - s)`` steps, s = ``rollout.async_staleness`` (base = 0, or the resumed step of a
checkpoint written without this state). Steps are sampling rounds, not optimizer updates (a step makes
algo.num_iterations x train.updates_per_batch of them): staleness counts steps.
Batch j is drawn with its own generator, seeded by (seed, j), and with
prompts drawn by the trainer's thread when version ``j - s`` is published (at the start for the first s + 1
batches). Nothing depends on when the sampler runs, how many workers there are or which one took the batch,
so an asynchronous run is as deterministic as a synchronous one, and its staleness is ``min(j - base, s)``.

Several trainer ranks (torchrun, data parallel). Each rank holds the whole model and its own plan: every rank
draws the same global prompts (the same seeded sampler) and samples its slice of them, as the synchronous path
splits them (``local``), with its own generator (the seed is the rank's: train/distributed.py ``rank_seed``).
The weights are equal on every rank after each update, so every rank publishes the same version at the same
point of the schedule and the ranks' plans differ only in the slice. The checkpoint keeps the global prompts,
so rank 0's state resumes every rank.

What a checkpoint after k updates keeps (``state_dict``): the prompts already drawn for batches k .. k + s
(the data position has passed them) and the trainable tensors of the snapshots k - s .. k - 1 those batches
are sampled with (version k is the checkpoint's own weights). On resume the in-flight batches are sampled
again from them, which is what the uninterrupted run sampled: a resumed run equals it bit for bit on CPU.
The cost is s copies of the trainable tensors in the checkpoint (with LoRA, s copies of the adapters).
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np
import torch

from grpokit.config.base import ConfigError
from grpokit.nn.models import sampling_snapshot


def batch_generator(seed: int, index: int, device: torch.device) -> torch.Generator:
    """Batch ``index``'s own sampling generator: a function of (seed, index) only."""
    # int before the shift: numpy 1.x refuses uint64 >> int (numpy 2 promotes it)
    mixed = int(np.random.SeedSequence([seed, index, 0xA5]).generate_state(1, np.uint64)[0]) >> 1
    return torch.Generator(device=device).manual_seed(mixed)


log = logging.getLogger("grpokit.rollout")


class AsyncPlan:
    """The schedule of an asynchronous run: the snapshots (version -> frozen model), the prompts drawn
    ahead (batch index -> prompts), and the versions each batch takes. Called from the trainer's thread
    only (``publish``, ``state_dict``); the sampler reads ``job`` under its engine's lock."""

    def __init__(
        self,
        model: torch.nn.Module,
        step: int,
        next_batch: Callable[[int], list],
        *,
        prompts_per_step: int,
        max_staleness: int,
        seed: int,
        state: dict | None = None,
        rank: int = 0,
        world_size: int = 1,
    ):
        """``prompts_per_step`` is the global batch (every rank's prompts), ``next_batch(n)`` draws n global
        prompts (the same on every rank), ``rank`` of ``world_size`` samples its slice of each."""
        self.n, self.s, self.seed, self.next_batch = prompts_per_step, max_staleness, seed, next_batch
        self.rank, self.world_size = rank, world_size
        self.step = step  # steps the trainer has made (a step may make several optimizer updates)
        self.warned_untaken = False
        self.trainable = [name for name, p in model.named_parameters() if p.requires_grad]
        snap, self.sync_bytes = sampling_snapshot(model)
        self.snapshots: dict[int, torch.nn.Module] = {step: snap}
        self.prompts: dict[int, list] = {}
        if state is None:  # a fresh run, or a checkpoint written without asynchronous sampling
            self.base = step
            for j in range(step, step + self.s + 1):
                self.prompts[j] = next_batch(self.n)
        else:
            self._load(model, state)

    def version_for(self, index: int) -> int:
        return max(self.base, index - self.s)

    def has_job(self, index: int) -> bool:
        return index in self.prompts and self.version_for(index) in self.snapshots

    def job(self, index: int) -> tuple[torch.nn.Module, int, list]:
        """``(snapshot, its version, this rank's prompts)`` of batch ``index`` (``has_job`` must be true)."""
        v = self.version_for(index)
        return self.snapshots[v], v, self.local(index)

    def local(self, index: int) -> list:
        """This rank's slice of batch ``index``'s global prompts (all of them with one rank)."""
        k = self.n // self.world_size
        return self.prompts[index][self.rank * k : (self.rank + 1) * k]

    def check_taken(self, taken: int, step: int) -> None:
        """Before the publish of ``step``: warn once if step ``step - 1`` did not train its prefetched batch
        (``taken``, the last batch handed out). The trainer then sampled that step itself, and the sampler's
        batch and its prompts went unused: a path that bypasses the prefetch (grpokit's fault, not the user's)."""
        if taken != step - 1 and not self.warned_untaken:
            self.warned_untaken = True
            log.warning(
                "step %d trained a batch the asynchronous sampler did not prefetch (rollout.async_staleness=%d): "
                "the trainer sampled it itself, and the sampler's batch %d and its prompts went unused; this is "
                "grpokit's fault, please report it with the run's config.yaml",
                step - 1,
                self.s,
                step - 1,
            )

    def publish(self, model: torch.nn.Module, step: int) -> None:
        """The policy after ``step`` steps: its snapshot, the prompts of batch ``step + s`` (the first it
        samples), and what no batch still needs dropped."""
        snap, self.sync_bytes = sampling_snapshot(model)
        self.snapshots[step] = snap
        self.step = step
        self.prompts[step + self.s] = self.next_batch(self.n)
        for v in [v for v in self.snapshots if v < self.version_for(step)]:
            del self.snapshots[v]
        for j in [j for j in self.prompts if j < step]:
            del self.prompts[j]

    def state_dict(self) -> dict:
        """The in-flight batches' prompts and the trainable tensors of the older snapshots they use."""
        k = self.step
        olds = range(self.version_for(k), k)
        return {
            "staleness": self.s,
            "step": k,
            "base": self.base,
            "prompts": {j: p for j, p in self.prompts.items() if j >= k},
            "snapshots": {v: self._trainable_tensors(self.snapshots[v]) for v in olds},
        }

    def _trainable_tensors(self, snap: torch.nn.Module) -> dict[str, torch.Tensor]:
        params = dict(snap.named_parameters())
        return {name: params[name].detach().clone() for name in self.trainable}

    def _load(self, model: torch.nn.Module, state: dict) -> None:
        if state["staleness"] != self.s or state["step"] != self.step:
            raise ConfigError(
                f"the checkpoint's asynchronous sampler was saved with rollout.async_staleness={state['staleness']} "
                f"at step {state['step']}, not {self.s} at step {self.step}; resume with its own "
                "rollout.async_staleness"
            )
        self.base = int(state["base"])
        self.prompts = dict(state["prompts"])
        for v, tensors in state["snapshots"].items():
            snap, _ = sampling_snapshot(model)
            params = dict(snap.named_parameters())
            with torch.no_grad():
                for name, t in tensors.items():
                    params[name].copy_(t)
            self.snapshots[v] = snap
