"""Stage 7's inputs from one step: the metrics line and the sample rows.

``Trainer._step_metrics`` (train/loop.py) calls these with the step's scored batch, the update's
inputs and the update's metrics; it reduces the line over ranks (each metric by its rule,
record/rank_reduction.py) and hands both to the recorder. What the ranks' own figures cannot give (a
std, a mean that leaves failures out, "solved") is taken over every rank's rows (``job_rows``).
Metric names follow TRL's where the concept is the same (``completions/mean_length``, ``reward_std``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from grpokit.data.domains import COLUMN
from grpokit.record.domain_metrics import domain_stats
from grpokit.record.rank_reduction import extreme
from grpokit.record.samples import sample_rows
from grpokit.record.signatures import group_signatures, solved_signatures
from grpokit.record.vision_samples import with_images
from grpokit.rewards.inputs import reward_prompts
from grpokit.rewards.values import value_stats
from grpokit.rollout.episode_metrics import episode_metrics
from grpokit.types import ScoredBatch

from .rollout_func import add_logged_columns
from .timer import Timer

# How a step's several optimizer updates (algo.num_iterations x train.updates_per_batch) become one line:
LAST_OF_UPDATES = ("learning_rate", "entropy_coef", "lambda_grpo/lambda")  # states: the one in force at the end
SUM_OF_UPDATES = ("skipped_nonfinite", "train/shared_prefix_tokens_saved")  # counts over the step
STEP_ONLY = ("grad_norm/max",)  # the step's own (not one update's): grpokit.trl's per-update entries leave it out


def step_update_metrics(updates: list[dict[str, float]]) -> dict[str, float]:
    """One line of the metrics of the optimizer updates a step applied, in order: a key in LAST_OF_UPDATES is
    the last update's, in SUM_OF_UPDATES summed, a min / max by its name (rank_reduction.extreme) the min / max; every
    other (``loss``, ``grad_norm``, ``clip_ratio/*``, ``entropy``, ``ratio/mean`` ...) the mean over the
    updates that report it; plus ``grad_norm/max``, the largest update's norm (a spike the mean would halve).
    ``{}`` for none (an update spanning steps, train.accumulation_slices, still accumulating). One update: its
    own metrics, and ``grad_norm/max`` = ``grad_norm``."""
    out: dict[str, float] = {}
    for k in dict.fromkeys(k for u in updates for k in u):
        vals = [u[k] for u in updates if k in u]
        if k in LAST_OF_UPDATES:
            out[k] = vals[-1]
        elif k in SUM_OF_UPDATES:
            out[k] = sum(vals)
        elif extreme(k) is not None:
            out[k] = max(vals) if extreme(k) == "max" else min(vals)
        else:
            out[k] = sum(vals) / len(vals)
    norms = [u["grad_norm"] for u in updates if "grad_norm" in u]
    if norms:
        out["grad_norm/max"] = max(norms, key=lambda v: v if v == v else float("inf"))  # a NaN norm is the worst
    return out


def logged_samples(
    sb: ScoredBatch, inputs, max_prompts: int, run_dir: Path, step: int, images: bool = True
) -> list[dict]:
    """The sample rows of step ``step``: prompt, completion, each reward, the sequence's advantage
    (a token-level advantage averaged over the row), length and finish reason; the reward
    functions' logged values; with ``images`` (record.samples_images), image prompts as PNGs with
    boxes drawn, for the report."""
    ro, G = sb.rollout, sb.group_size
    seq_adv = inputs.row_advantages  # computed once a step (grpokit.trl's _logs read it too)
    per_func = {n: sb.rewards_NF[:, f].tolist() for f, n in enumerate(sb.names)}
    shown = reward_prompts(sb.prompts, G, "grpokit", ro.episodes)  # N: with a reset() observation where one joined
    rows = sample_rows(
        shown[::G],
        sb.texts,
        per_func,
        sb.total_N.tolist(),
        seq_adv.tolist(),
        ro.model_lengths(),
        ro.finish_reasons,
        G,
        max_prompts=max_prompts,
        messages=[e.messages for e in ro.episodes] if ro.episodes else None,
        completion_prompts=shown,
    )
    rows = add_logged_columns(rows, sb.extra, G)
    return with_images(rows, sb.prompts, run_dir, step) if images else rows


@dataclass(frozen=True)
class JobRows:
    """Every rank's rows of a step, in rank order (one process: its own): what a metric over rows reads when
    the ranks' own figures cannot be combined (a std, a mean that leaves failures out, a domain's groups)."""

    total_N: torch.Tensor  # (N,) total rewards
    rewards_NF: torch.Tensor  # (N, F) each function's rewards, NaN where not applicable
    failed_NF: torch.Tensor  # (N, F) bool, the function failed on the completion
    lengths: list[int]  # (N,) the model's tokens of each completion
    tags: list  # (P,) each prompt's domain column (None without one)


def job_rows(sb: ScoredBatch, dist=None) -> JobRows:
    """The step's rows of every rank (``dist``: a distributed.DistContext; None or one process: ``sb``'s own).
    Collective: every rank calls it once per step (ranks hold equal shares, so the shapes match)."""
    F = sb.rewards_NF.shape[1]
    failed = torch.zeros_like(sb.rewards_NF, dtype=torch.bool) if sb.failed_NF is None else sb.failed_NF
    lengths = sb.rollout.model_lengths()
    tags = [p.columns.get(COLUMN) for p in sb.prompts]
    if dist is None or not dist.active:
        return JobRows(sb.total_N, sb.rewards_NF, failed, lengths, tags)
    rows = torch.cat(
        [
            sb.total_N.double()[:, None],
            sb.rewards_NF.double(),
            failed.double(),
            torch.tensor(lengths).double()[:, None],
        ],
        dim=1,
    )  # one gather for the numbers
    every = dist.gather_rows(rows)
    return JobRows(
        every[:, 0].to(sb.total_N.dtype),
        every[:, 1 : 1 + F].to(sb.rewards_NF.dtype),
        every[:, 1 + F : 1 + 2 * F] > 0.5,
        [int(n) for n in every[:, -1].tolist()],
        [t for part in dist.gather_objects(tags) for t in part],
    )


def domain_metrics(rows: JobRows, sb: ScoredBatch, graders: dict[str, str]) -> dict[str, float]:
    """The step's metrics per domain (record/domain_metrics.py) over every rank's groups."""
    return domain_stats(rows.tags, rows.total_N, rows.rewards_NF, sb.names, rows.lengths, sb.group_size, graders)


def rank_weights(sb: ScoredBatch) -> dict[str, float]:
    """This rank's counts that a ``weighted`` or ``rate`` rule of record/rank_reduction.py may name: ``tokens``,
    the model's tokens of its completions."""
    return {"tokens": float(sum(sb.rollout.model_lengths()))}


def sampling_metrics(
    sb: ScoredBatch, inputs, same_length_min_tokens: int, rows: JobRows | None = None
) -> dict[str, float]:
    """The metrics of a step known once it is sampled, scored and its advantages taken: rewards, the update's
    inputs, completion lengths (the model's tokens of an episode, as TRL) and the health monitors' group and
    solved signatures. This rank's figures but those that need every rank's ``rows`` (``job_rows``): each
    function's mean and std over the completions it scored, and "solved" against the job's best reward."""
    ro, G = sb.rollout, sb.group_size
    P = len(sb.prompts)
    rows = rows if rows is not None else job_rows(sb)
    lengths = ro.model_lengths()
    return {
        **sb.metrics,
        **{
            k: v
            for f, n in enumerate(sb.names)
            for k, v in value_stats(rows.rewards_NF[:, f], rows.failed_NF[:, f], n).items()
        },
        **episode_metrics(ro),
        "reward": sb.total_N.mean().item(),
        "reward_std": sb.total_N.view(P, G).std(dim=1, unbiased=False).mean().item(),  # population, as documented
        **inputs.metrics,
        "completions/mean_length": float(np.mean(lengths)),
        "completions/min_length": float(min(lengths)),
        "completions/max_length": float(max(lengths)),
        "completions/clipped_ratio": ro.finish_reasons.count("length") / len(lengths),
        **group_signatures(sb.texts, lengths, G, ro.finish_reasons, same_length_min_tokens),
        # lets the monitors tell convergence from collapse
        **solved_signatures(sb.texts, sb.total_N.tolist(), G, best=float(rows.total_N.max())),
    }


def step_metrics(
    sb: ScoredBatch,
    inputs,
    update_metrics: dict[str, float],
    timer: Timer,
    same_length_min_tokens: int,
    data_position: int,
    rows: JobRows | None = None,
) -> dict[str, float]:
    """This rank's metrics of a step: ``sampling_metrics``, the update's, timings, this rank's throughput and the
    data position. No collective: ``reduce_metrics`` makes the throughput the job's in its one gather (every
    rank's ``tokens``, ``rank_weights``, over the slowest rank's seconds: record/rank_reduction.py's ``rate``)."""
    tokens = float(sum(sb.rollout.model_lengths()))
    # asynchronous rollout: the sampler's own seconds on this batch (time/sampling); the trainer's rollout span
    # only took it. The rate rule divides by the same seconds over ranks.
    rollout_s = update_metrics.get("time/sampling", timer.spans.get("rollout", 0.0))
    step_s = timer.total()
    return {
        **sampling_metrics(sb, inputs, same_length_min_tokens, rows),
        **update_metrics,
        **timer.metrics(),
        "time/step": step_s,  # the seconds the throughput divides by
        "tokens_per_second": tokens / max(step_s, 1e-9),
        "rollout/tokens_per_second": tokens / max(rollout_s, 1e-9),
        "data/position": float(data_position),
    }
