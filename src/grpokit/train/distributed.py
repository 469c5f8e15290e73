"""Data-parallel GRPO on ``torch.distributed``: what is local, what is global, and why it is exact.

Launch with ``torchrun --nproc_per_node K -m grpokit.cli train ...`` (one node) or with a rendezvous
endpoint for several nodes (docs/SCALING.md). With K ranks and ``train.prompts_per_step = P``:

* Prompts. Every rank draws the same P prompts from the same seeded sampler and keeps its slice of
  P/K; a group of G completions is therefore always whole on one rank, so group statistics
  (mean, std, leave-one-out) need no communication.
* Sampling. Rank r samples with its own generator, seeded by (seed, rank); rank 0 keeps the plain
  seed, so a 1-process run samples exactly what it sampled before distribution existed.
* Advantages. Rewards are all-gathered into the global (P, G) matrix and every rank computes the
  same advantages and metrics, so batch-wide modes (scale="batch", "batch_whiten", "token_whiten";
  completion lengths are gathered too) see the whole batch, then each rank keeps its rows.
* Loss. ``accumulate`` (train/update.py) receives the *global* sequence and token counts (all-reduced), so each
  rank's loss is its share of the global loss: sum_r loss_r = the loss a single process would
  compute on the whole batch.
* Gradients. Because the shares already carry the global normalisers, gradients are *summed*
  across ranks (all_reduce SUM), not averaged; the clipped norm is then the global norm on every
  rank and all ranks apply the same step. (Averaging would divide the update by K.)

* Metrics. Rank 0 writes one line for the job: ``reduce_metrics`` combines the ranks' values of each
  metric by the rule its name declares (record/rank_reduction.py: counts summed, means over equal shares
  averaged, extremes, rates weighted by their own counts; a stage's statistic of its own rows pooled by the
  ``weight/`` counts it gives beside it), all in one gather a step; what they cannot give is taken over every
  rank's rows (train/step_metrics.py ``job_rows``).

``tests/train/test_distributed.py`` runs 2 gloo processes and 1 process on the same global batch and
compares the final weights; ``tests/train/test_distributed_metrics.py`` every metric.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from grpokit.record.rank_reduction import WEIGHT, combine

log = logging.getLogger("grpokit.train")


@dataclass
class DistContext:
    """This process's place in the job; world_size 1 makes every method a no-op."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    fsdp: bool = False  # FSDP2 reduces gradients itself

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def sum_float(self, value: float) -> float:
        """Sum of ``value`` over ranks (float64 on the wire, so counts stay exact)."""
        return self.sum_floats([value])[0]

    def sum_floats(self, values: list[float]) -> list[float]:
        """Each of ``values`` summed over ranks, in one all-reduce (float64 on the wire, so counts stay exact);
        every rank passes as many numbers, in the same order."""
        if not self.active or not values:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return [float(v) for v in t.tolist()]

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` along dim 0 in rank order (equal shapes on all ranks)."""
        if not self.active:
            return x
        src = x.detach().to(self._comm_device()).contiguous()
        parts = [torch.empty_like(src) for _ in range(self.world_size)]
        dist.all_gather(parts, src)
        return torch.cat(parts).to(x.device)

    def gather_varlen(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's 1-d ``x`` in rank order; lengths may differ between ranks.

        (Padded to the longest rank's length for the all_gather, then trimmed.)
        """
        if not self.active:
            return x
        dev = self._comm_device()
        n = torch.tensor([x.numel()], dtype=torch.long, device=dev)
        sizes = [torch.empty_like(n) for _ in range(self.world_size)]
        dist.all_gather(sizes, n)
        lengths = [int(s.item()) for s in sizes]
        src = torch.zeros(max(lengths), dtype=x.dtype, device=dev)
        src[: x.numel()] = x.detach().reshape(-1).to(dev)
        parts = [torch.empty_like(src) for _ in lengths]
        dist.all_gather(parts, src)
        return torch.cat([part[:k] for part, k in zip(parts, lengths)]).to(x.device)

    def any_rank(self, flag: bool) -> bool:
        """True when ``flag`` is true on at least one rank (a collective: every rank must call it)."""
        if not self.active:
            return flag
        return self.sum_float(1.0 if flag else 0.0) > 0

    def local_rows(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's equal share of a global dim-0 tensor (the inverse of ``gather_rows``)."""
        n = x.shape[0] // self.world_size
        return x[self.rank * n : (self.rank + 1) * n]

    def sync_grads(self, params: list[torch.Tensor]) -> None:
        """Sum gradients over ranks (see the module docstring for why a sum)."""
        if not self.active:
            return
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        if self.fsdp:  # FSDP2 already reduce-scattered the mean of the ranks' shares: times K is the sum
            for g in grads:
                g.mul_(self.world_size)
            return
        flat = torch.cat([g.reshape(-1) for g in grads])  # one collective instead of one per tensor
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def broadcast_params(self, model: torch.nn.Module) -> None:
        """Make every rank start from rank 0's trainable weights (fresh LoRA adapters included)."""
        if not self.active:
            return
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    dist.broadcast(p.data, src=0)

    def gather_objects(self, obj: Any) -> list[Any]:
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def _comm_device(self) -> torch.device:
        return (
            torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        )


def setup(fsdp: bool = False, timeout_s: float = 0) -> DistContext:
    """Join the process group torchrun describes (WORLD_SIZE > 1, or any WORLD_SIZE with FSDP), or
    use one already initialised.

    NCCL when CUDA is available, gloo otherwise (CPU tests); ``timeout_s`` bounds a collective's wait
    (0: torch's default).
    """
    if not dist.is_available():
        return DistContext(fsdp=fsdp)
    # FSDP joins even a one-process group (torchrun --nproc_per_node 1): FSDP2 needs a process group
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1 or (fsdp and "WORLD_SIZE" in os.environ)
    if timeout_s > 0 and (dist.is_initialized() or not launched):  # a launch's property: warned, not refused
        log.warning(
            "grpokit: warning: train.dist_timeout_s=%g changes nothing in this run: %s; it bounds a collective's "
            "wait in a process group grpokit joins (torchrun)",
            timeout_s,
            "the process group was joined before, with its own timeout"
            if dist.is_initialized()
            else "it is one process",
        )
    if not dist.is_initialized() and launched:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend, **({"timeout": timedelta(seconds=timeout_s)} if timeout_s > 0 else {}))
    if not dist.is_initialized():
        return DistContext(fsdp=fsdp)
    rank, world_size, local_rank = position()
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, fsdp=fsdp)


def joined() -> bool:
    """Whether this process is in a process group already: under torchrun, building a ``transformers``
    ``TrainingArguments`` (grpokit.trl's GRPOConfig) joins one, and a script may join its own; ``setup`` then
    joins nothing, so a timeout given to it changes nothing."""
    return dist.is_available() and dist.is_initialized()


def position() -> tuple[int, int, int]:
    """``(rank, world size, local rank)`` of this process: from the process group once joined, else
    from torchrun's RANK / WORLD_SIZE / LOCAL_RANK (a process group not joined yet), else (0, 1, 0)."""
    if dist.is_available() and dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return rank, world_size, int(os.environ.get("LOCAL_RANK", rank))


def rank_device(ctx: DistContext, device: torch.device) -> torch.device:
    """One GPU per rank: "cuda" becomes "cuda:LOCAL_RANK" when running under torchrun."""
    if ctx.active and device.type == "cuda" and device.index is None:
        return torch.device("cuda", ctx.local_rank)
    return device


def rank_seed(seed: int, rank: int) -> int:
    """The sampling seed of a rank: the plain seed on rank 0, a well-mixed (seed, rank) elsewhere."""
    if rank == 0:
        return seed
    # int before the shift: numpy 1.x refuses uint64 >> int (numpy 2 promotes it)
    return int(np.random.SeedSequence([seed, rank]).generate_state(1, dtype=np.uint64)[0]) >> 1


def reduce_metrics(
    ctx: DistContext, metrics: dict[str, float], weights: dict[str, float] | None = None
) -> dict[str, float]:
    """One line of the job from every rank's ``metrics``: each name by its declared rule (record/rank_reduction.py:
    the job's figure kept, counts summed, means over equal shares averaged, extremes, rates weighted by their
    own counts; ``weights`` are this rank's counts such a rule may name, e.g. ``tokens``; a statistic with a
    ``weight/`` count beside it pooled by those counts). The union of keys is kept, so a metric one rank lacks
    cannot hang the job. ``weight/`` entries are never part of the line (one process: only they are dropped)."""
    if not ctx.active:
        return {k: v for k, v in metrics.items() if not k.startswith(WEIGHT)}
    every = ctx.gather_objects((metrics, weights or {}))
    return combine([m for m, _ in every], [w for _, w in every])


def fully_shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: shard every decoder block, then the root.

    Blocks are the children of the first ``nn.ModuleList`` found (``model.layers`` in most causal
    LMs), the usual unit of sharding: one block's full weights exist at a time during the forward.
    """
    from torch.distributed.fsdp import fully_shard

    blocks = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), None)
    for block in blocks or []:
        fully_shard(block)
    # logprobs.py calls the backbone and the output head directly (chunked logits), not the root
    # module, so each gets its own unit: its forward hooks then gather its parameters.
    # (Untied heads only: a weight tied to the embeddings cannot live in two units.)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is not None and decoder is not model:
        fully_shard(decoder)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        fully_shard(head)
    fully_shard(model)
    # FSDP2 averages gradients over ranks; ``DistContext.sync_grads`` multiplies by K to get the sum
    # the global normalisers need. (A divide factor of 1 would say it directly, but it is carried out
    # with PREMUL_SUM, which gloo lacks.)
    return model
