"""Token masks: which completion tokens the loss trains on. Pure functions of tensors.

Each mask narrows ``completion_mask`` (1 on the model's own tokens), in one of two ways. DAPO's
overlong filtering removes truncated completions from the loss altogether (normalisers, KL, metrics,
as TRL's mask_truncated_completions). The entropy top-fraction and DeepSeek-V3.2's off-policy masking
(inside the loss, since the drift changes with every update) remove tokens from the policy term only:
those tokens keep their KL term and their place in the normalisers, as in the papers' objectives and
TRL's code. algo/registry.py names them for the config (``StageSpec.policy_only``).
"""

from __future__ import annotations

import torch

TRUNCATION_RULES = ("finish", "last_token")  # algo.truncated_by


def ended_rows(completion_ids: list, end_ids: frozenset[int]) -> list[bool] | None:
    """Whether each completion's last token is one of ``end_ids`` (TRL's rule; an empty one did not end); None
    without end ids."""
    return [bool(len(c)) and int(c[-1]) in end_ids for c in completion_ids] if end_ids else None


def truncated_sequences_mask(
    mask_NT: torch.Tensor, finish_reasons: list[str], ended: list[bool] | None = None
) -> torch.Tensor:
    """DAPO's overlong filtering: rows whose completion was cut by the length limit ("length") or
    by the episode's turn limit ("turns") leave the loss, ``(N, T)``; given ``ended`` (TRL's rule,
    algo.truncated_by=last_token: whether each row's last completion token is an end-of-sequence or
    pad id), the rows that did not end so leave it instead, whatever their finish reason."""
    kept = ended if ended is not None else [f not in ("length", "turns") for f in finish_reasons]
    keep_N = torch.tensor(kept, dtype=mask_NT.dtype, device=mask_NT.device)
    return mask_NT * keep_N[:, None]  # DAPO: overlong filtering


def overlong_filter(
    mask_NT: torch.Tensor, finish_reasons: list[str], truncated_by: str, ended: list[bool] | None
) -> torch.Tensor:
    """DAPO's overlong filtering as ``truncated_by`` (algo.truncated_by) reads truncation, ``(N, T)``: "finish"
    by the finish reasons, "last_token" by ``ended`` (``ended_rows``, TRL's rule; ValueError without it). The one
    place the choice is made, for training's token mask and grpokit.trl's evaluation alike."""
    if truncated_by == "last_token" and ended is None:
        raise ValueError("algo.truncated_by=last_token needs the run's end ids (StepSettings.end_ids)")
    return truncated_sequences_mask(mask_NT, finish_reasons, ended if truncated_by == "last_token" else None)


def offpolicy_sequences(
    logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, delta: float
) -> torch.Tensor:
    """Boolean ``(N,)``: sequences to mask under DeepSeek-V3.2's off-policy sequence masking.

    A sequence is masked when its mean advantage is negative and the policy has drifted from the
    one that sampled it by more than ``delta`` in mean log-ratio:
    ``1/|o| sum_t (old_logp - logp) > delta`` (a sample estimate of KL(pi_old || pi_theta)).
    Positive-advantage sequences are always kept: learning from a good sample stays useful.
    """
    mask = mask_NT.to(logp_NT.dtype)
    n_N = mask.sum(dim=1).clamp(min=1)
    # a NaN log-ratio (a position nobody scored) counts as no drift, as TRL's mask does; padding never counts
    diff = torch.nan_to_num(old_logp_NT - logp_NT, nan=0.0, posinf=torch.inf, neginf=-torch.inf)
    drift_N = torch.where(mask > 0, diff, torch.zeros_like(diff)).sum(dim=1) / n_N
    adv_N = (adv_NT * mask).sum(dim=1) / n_N
    return (adv_N < 0) & (drift_N > delta)


def entropy_token_mask(
    entropy_NT: torch.Tensor, mask_NT: torch.Tensor, top_fraction: float, pool: torch.Tensor | None = None
) -> torch.Tensor:
    """Keep only the highest-entropy ``top_fraction`` of the batch's completion tokens.

    "Beyond the 80/20 rule" (Wang et al., 2025): the gradient of the few high-entropy "forking"
    tokens carries most of the RL signal. The threshold is the ``1 - top_fraction`` quantile of the
    entropies of all real tokens of the batch; tokens at or above it stay in the mask.

    ``pool`` (1-d): the entropies the quantile is taken over, when the batch is larger than these
    rows; with several ranks it is every rank's real-token entropies, so each rank keeps exactly
    the tokens one process would keep of the whole batch. Default: ``entropy_NT[mask_NT > 0]``.
    """
    if not (0.0 < top_fraction <= 1.0):
        raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
    real = mask_NT.bool()
    pool = entropy_NT[real] if pool is None else pool
    if top_fraction == 1.0 or pool.numel() == 0:
        return mask_NT
    threshold = torch.quantile(pool.float(), 1.0 - top_fraction)
    return mask_NT * (entropy_NT >= threshold).to(mask_NT.dtype)
