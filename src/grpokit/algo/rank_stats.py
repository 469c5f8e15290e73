"""A figure of the whole job from each data-parallel rank's part of it.

Under torchrun each rank holds its own rows, so a statistic a rank measures is of its part only. A part that
says how many values it covers (its count ``n_r``) combines exactly, whatever the counts:

    mean   M = sum_r n_r m_r / sum_r n_r                                 (a rate is a mean too)
    std    S = sqrt(sum_r n_r (s_r^2 + (m_r - M)^2) / sum_r n_r)        (population std, as ``_stats``)
    min, max  over the parts that cover a value (an empty part's placeholder is left out)
    count  sum_r c_r

``pool`` is the pure combination; ``over_ranks`` gathers the parts and applies it, for the stages whose
metrics are measured on this rank's rows only (step-level credit, token statistics), so that every rank
then holds the job's figure (train/distributed.py's ``reduce_metrics`` takes it as it is).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch


class RowGather(Protocol):
    """What ``over_ranks`` asks of the distributed context (pipeline.Collectives has it)."""

    active: bool

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor: ...


def _kind(key: str, keys: set[str]) -> str:
    """How ``key`` combines: ``max`` / ``min`` by its last name, ``std`` when its ``mean`` sibling is there,
    else ``mean``."""
    leaf = key.rsplit("/", 1)[-1]
    if leaf == "max" or leaf.endswith("_max"):
        return "max"
    if leaf == "min" or leaf.endswith("_min"):
        return "min"
    if leaf == "std" and key[: -len("std")] + "mean" in keys:
        return "std"
    return "mean"


def pool(parts: list[dict[str, tuple[float, float]]], sums: tuple[str, ...] = ()) -> dict[str, float]:
    """The job's metrics from every rank's ``{key: (count, value)}`` (same keys on every rank): keys in ``sums``
    added up, every other one combined by its kind (``_kind``) with the counts as weights (see the module
    docstring). A mean over no value at all is 0.0 (``_stats``' empty value), a min / max the first part's.

    Example, two ranks' advantages over 1 and 3 values: rank 0 {mean 2, std 0, max 2}, rank 1
    {mean 6, std 2, max 9}: M = (1*2 + 3*6) / 4 = 5; S^2 = (1*(0 + 9) + 3*(4 + 1)) / 4 = 6, S = 2.449; max 9."""
    keys = set(parts[0])
    out: dict[str, float] = {}
    for key in sorted(keys):
        counts = [p[key][0] for p in parts]
        values = [p[key][1] for p in parts]
        total = sum(counts)
        kind = "sum" if key in sums else _kind(key, keys)
        if kind == "sum":
            out[key] = sum(values)
        elif kind in ("max", "min"):
            covered = [v for n, v in zip(counts, values) if n > 0] or values[:1]
            out[key] = max(covered) if kind == "max" else min(covered)
        elif total <= 0:
            out[key] = 0.0
        elif kind == "mean":
            out[key] = sum(n * v for n, v in zip(counts, values)) / total
        else:  # std: each part's spread around its own mean plus its mean's distance from the job's
            means = [p[key[: -len("std")] + "mean"][1] for p in parts]
            job_mean = sum(n * m for n, m in zip(counts, means)) / total
            var = sum(n * (s * s + (m - job_mean) ** 2) for n, s, m in zip(counts, values, means)) / total
            out[key] = math.sqrt(max(var, 0.0))
    return out


def over_ranks(
    metrics: dict[str, float], dist: RowGather, counts: dict[str, float], sums: tuple[str, ...] = ()
) -> dict[str, float]:
    """``metrics`` of this rank's rows made the job's (unchanged with one process). ``counts``: how many values
    each metric covers on this rank, by its key or by its prefix (``advantages`` for ``advantages/mean``,
    ``/std``, ``/min``, ``/max``); ``sums``: counts of this rank, added up. A metric in neither is left as it
    is (a setting, equal on every rank). Every rank must call it with the same keys (one all-gather)."""
    if not dist.active:
        return metrics

    def count(key: str) -> float | None:
        return counts.get(key, counts.get(key.rsplit("/", 1)[0]))

    keys = [k for k in sorted(metrics) if k in sums or count(k) is not None]
    if not keys:
        return metrics
    local = torch.tensor(
        [[float(count(k) or 0.0) if k not in sums else 1.0, float(metrics[k])] for k in keys], dtype=torch.float64
    )
    every = dist.gather_rows(local[None]).tolist()  # (ranks, keys, 2)
    parts = [{k: (row[i][0], row[i][1]) for i, k in enumerate(keys)} for row in every]
    return {**metrics, **pool(parts, sums)}
