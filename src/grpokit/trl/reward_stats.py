"""TRL 1.16's reward metrics of one generation batch, as ``GRPOTrainer._generate_and_score_completions``
computes them (training and evaluation alike), over the rewards of every process:

* ``rewards/<f>/mean``, ``rewards/<f>/std``: the NaN-skipping mean and Bessel-corrected std of function
  ``f``'s column (a function returning None for a completion leaves it out; so does a failed call, whose
  ``failure_value`` counts in the total as trained but is no value of the function: docs/REWARDS.md);
* ``reward``, ``reward_std``: the same over the weighted sum, leaving out the completions every function
  returned None for (TRL marks them NaN);
* ``frac_reward_zero_std``: the share of completions whose scaling std is 0 (``torch.isclose``, so <= 1e-8):
  each group's std with ``scale_rewards`` group or none, the batch's with batch; with
  ``multi_objective_aggregation="normalize_then_sum"`` the batch std of the summed per-function z-scores.

``reward_scaling`` reads the GRPOConfig's scale_rewards and multi_objective_aggregation they depend on;
``round_metrics`` puts them over grpokit's sampling metrics of a training round (bridge.py logs them).

grpokit's own ``reward_std`` is another statistic (the mean of the within-group stds, docs/MONITORING.md);
under grpokit.trl the log entries carry these, TRL's.
"""

from __future__ import annotations

from typing import Any

import torch


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Bessel-corrected standard deviation of the non-NaN values (NaN where fewer than two), TRL's."""
    mean = torch.nanmean(x, dim=dim, keepdim=True) if dim is not None else torch.nanmean(x)
    count = (~x.isnan()).sum(dim=dim, keepdim=True) if dim is not None else (~x.isnan()).sum()
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True) if dim is not None else torch.nanmean((x - mean) ** 2)
    var = torch.where(count > 1, var * count / (count - 1), torch.full_like(var, float("nan")))
    out = var.sqrt()
    return out if keepdim or dim is None else out.squeeze(dim)


def trl_reward_metrics(
    rewards_NF: torch.Tensor,
    weights: list[float],
    names: list[str],
    group_size: int,
    scale_rewards: str = "group",
    aggregation: str = "sum_then_normalize",
    failed_NF: torch.Tensor | None = None,
) -> dict[str, float]:
    """TRL's reward metrics of ``rewards_NF`` (N, F), every process's rows in order (groups of
    ``group_size`` contiguous), NaN where a function returned None; ``weights`` are reward_weights;
    ``failed_NF`` (N, F) bool, where a function failed (its entry holds failure_value; None: none failed)."""
    r = rewards_NF.float()
    w = torch.tensor(weights, dtype=torch.float32)
    unscorable_N = r.isnan().all(dim=1)
    own_NF = r if failed_NF is None else r.masked_fill(failed_NF.bool(), float("nan"))  # the functions' own values
    out: dict[str, float] = {}
    for f, name in enumerate(names):
        out[f"rewards/{name}/mean"] = torch.nanmean(own_NF[:, f]).item()
        out[f"rewards/{name}/std"] = nanstd(own_NF[:, f]).item()
    total_N = (r * w).nansum(dim=1)
    total_N[unscorable_N] = float("nan")
    if aggregation == "normalize_then_sum":
        grouped = r.view(-1, group_size, r.shape[1])
        z = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)) / (nanstd(grouped, dim=1, keepdim=True) + 1e-4)
        summed = (z.view(-1, r.shape[1]) * w).nansum(dim=1)
        summed[unscorable_N] = float("nan")
        std_N = nanstd(summed).expand_as(summed) if summed.numel() > 1 else torch.zeros_like(summed)
    elif scale_rewards == "batch":
        std_N = nanstd(total_N).expand_as(total_N) if total_N.numel() > 1 else torch.zeros_like(total_N)
    elif group_size > 1:
        std_N = nanstd(total_N.view(-1, group_size), dim=1).repeat_interleave(group_size)
    else:
        std_N = torch.zeros_like(total_N)
    out["reward"] = torch.nanmean(total_N).item()
    out["reward_std"] = nanstd(total_N).item()
    out["frac_reward_zero_std"] = torch.isclose(std_N, torch.zeros_like(std_N)).float().mean().item()
    return out


def reward_scaling(args: Any) -> tuple[str, str]:
    """TRL's scale_rewards of GRPOConfig ``args`` (True: group, False: none, else its name) and its
    multi_objective_aggregation: what ``trl_reward_metrics`` scales by, in training and evaluation."""
    scale = {True: "group", False: "none"}.get(args.scale_rewards, args.scale_rewards)
    return scale, args.multi_objective_aggregation


def round_metrics(trainer: Any, args: Any, sb: Any, inputs: Any, rows: Any) -> dict[str, float]:
    """A sampled round's metrics under grpokit.trl, as TRL logs them with the round's first step: grpokit's
    sampling metrics of ``sb`` (its update ``inputs``) reduced over ranks, then TRL's reward metrics over every
    rank's ``rows`` (train/step_metrics.job_rows) in their place. Collective under torchrun."""
    from grpokit.train import distributed
    from grpokit.train.step_metrics import rank_weights, sampling_metrics

    metrics = sampling_metrics(sb, inputs, trainer.cfg.health.same_length_min_tokens, rows)
    metrics = distributed.reduce_metrics(trainer.dist, metrics, rank_weights(sb))
    weights = [s.weight for s in trainer.runner.specs]
    scale, aggregation = reward_scaling(args)
    metrics.update(
        trl_reward_metrics(rows.rewards_NF, weights, sb.names, sb.group_size, scale, aggregation, rows.failed_NF)
    )
    return metrics
