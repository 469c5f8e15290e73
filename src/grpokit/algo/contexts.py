"""What the algorithm's registered stages read: an advantage estimator an ``AdvantageContext``, a token mask
a ``MaskContext`` (registry.py names them; pipeline.py builds them once a step), and the few collectives they
ask of the distributed context. Plain records, so estimators.py and a plugin can name them without importing
the pipeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from grpokit.config.sections import AlgoConfig
from grpokit.types import ScoredBatch


class Collectives(Protocol):
    """What the stages ask of the distributed context (train/distributed.py's DistContext; ``OneProcess``
    for one process): whether several ranks run, and rows gathered from or kept by this rank."""

    active: bool

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor: ...

    def local_rows(self, x: torch.Tensor) -> torch.Tensor: ...

    def gather_varlen(self, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class AdvantageContext:
    """What an advantage estimator may read."""

    algo: AlgoConfig
    scored: ScoredBatch
    rewards_N: torch.Tensor  # (N,) after the reward stages, CPU; NaN for an unscorable completion (scored_N)
    mask_NT: torch.Tensor  # (N, T) completion mask
    entropy_NT: torch.Tensor | None
    group_size: int
    dist: Collectives
    process_fn: Callable | None = None
    params: object | None = None  # the estimator's own parameters (advantage_params: its StageSpec.params record)

    @property
    def scored_N(self) -> torch.Tensor:
        """Boolean ``(N,)``: False for an unscorable completion (every reward function returned None), whose
        ``rewards_N`` is NaN: an estimator leaves it out of every statistic and gives it advantage 0."""
        return ~torch.isnan(self.rewards_N)


@dataclass(frozen=True)
class MaskContext:
    """What a token mask may read; ``mask_NT`` is the mask so far."""

    algo: AlgoConfig
    mask_NT: torch.Tensor  # (N, T)
    entropy_NT: torch.Tensor | None
    finish_reasons: list[str]
    dist: Collectives
    ended: list[bool] | None = None  # each completion's last token an end id (TRL's rule; None: no end ids given)


class OneProcess:
    """The distributed context of a single process: every collective is the identity."""

    active = False

    @staticmethod
    def gather_rows(x):
        return x

    local_rows = gather_varlen = gather_rows


WEIGHT = "weight/"
"""The prefix of a metric's ``weight/<key>`` entry: how many values ``<key>`` covers on this rank (part_weights)."""


def part_weights(counts: dict[str, float | torch.Tensor]) -> dict[str, float]:
    """``weight/<key>`` entries for a stage's metrics measured on this rank's rows only: how many values each
    covers here, by key or by prefix (``advantages`` for ``advantages/mean``, ``/std``, ``/min``, ``/max``).
    The step's one reduction over ranks pools such a metric by them (record/rank_reduction.py: means and stds
    weighted, extremes over the parts that cover a value, ``num_`` counts summed); they are never written.
    Example: a rank's 12 trained tokens -> ``{"weight/advantages": 12.0}``."""
    return {WEIGHT + k: float(v) for k, v in counts.items()}
