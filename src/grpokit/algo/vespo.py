"""VESPO: a REINFORCE term weighted by a gamma-shaped function of the sequence's importance weight.

With ``w = pi_theta(o|q) / pi_old(o|q)`` (the trajectory ratio, the product of the token ratios) the
per-token objective is ``sg(phi(w)) * A * log pi_theta`` where

    phi(w) = exp(lambda) * w^k * exp(-lambda * w) = exp(lambda + k log w - lambda w)

is normalised so that ``phi(1) = 1`` (on-policy it is REINFORCE) and fades to 0 both for ``w -> 0``
and for large ``w``, instead of PPO's hard clip. ``(k, lambda)`` are ``vespo_pos`` where ``A >= 0`` and
``vespo_neg`` where ``A < 0`` (``VESPOParams``). The facts (the formula, ``log w`` bounded to
``[log 1e-8, 20]``, lambda at least 1e-4, a non-finite weight taken as 0, token-mean aggregation)
follow TRL 1.16's ``loss_type="vespo"``; tests/project/test_bench_loss_equality.py checks the value and
gradient against it. One difference at extremes: TRL also bounds each token's log-ratio to [-20, 20]
before summing; here the sum is bounded, which differs only when a single token's ratio is beyond e^20.

With a separate sampler (vLLM) and TIS in a ``token_*`` mode, TRL does not multiply the loss by the
sampler weights ``r_t = pi_old / pi_sampler``: it adds ``sum_t log r_t`` (each bounded to
``[log 1e-8, 20]``, so a masked token's 0 counts as 1e-8) to ``log w``. ``sampler_log_weight`` computes
that sum; VESPO declares it (``ObjectiveSpec.sampler_weight``), so the pipeline passes it to the loss
instead of weighting the advantages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .registry import ObjectiveSpec, register_objective
from .settings import ClipSettings, no_clipping

LOG_W_MIN, LOG_W_MAX = math.log(1e-8), 20.0  # bounds of log w (TRL's)


@dataclass(frozen=True)
class VESPOParams:
    """VESPO's ``(k, lambda)`` pairs (the config's fields of the same names)."""

    vespo_pos: tuple[float, float] = (2.0, 3.0)  # where A >= 0 (TRL's vespo_k_pos, vespo_lambda_pos)
    vespo_neg: tuple[float, float] = (3.0, 2.0)  # where A < 0 (TRL's vespo_k_neg, vespo_lambda_neg)

    def __post_init__(self) -> None:  # the config holds lists
        object.__setattr__(self, "vespo_pos", tuple(self.vespo_pos))
        object.__setattr__(self, "vespo_neg", tuple(self.vespo_neg))


def vespo_config_errors(a) -> list[str]:
    """The pairs are checked whatever the objective; the trajectory ratio only when VESPO is chosen."""
    out = []
    if a.objective == "vespo" and a.ratio_level != "trajectory":
        out.append(
            "algo.objective=vespo weighs each completion by its trajectory ratio, but "
            f"algo.ratio_level={a.ratio_level}; "
            "set algo.ratio_level=trajectory"
        )
    if not all(len(v) == 2 and v[0] >= 0 and v[1] > 0 for v in (a.vespo_pos, a.vespo_neg)):
        out.append(
            f"algo.vespo_pos={a.vespo_pos} and algo.vespo_neg={a.vespo_neg} must each be [k >= 0, lambda > 0] "
            "(defaults [2, 3] and [3, 2])"
        )
    return out


@torch.no_grad()
def gamma_weight(
    ratio_NT: torch.Tensor, adv_NT: torch.Tensor, pos: tuple[float, float], neg: tuple[float, float]
) -> torch.Tensor:
    """``phi(w)`` per token ``(N, T)`` from the trajectory ratio ``w`` (constant along each sequence)."""
    log_w = torch.log(ratio_NT).clamp(LOG_W_MIN, LOG_W_MAX)  # log(inf) -> 20, log(0) -> log 1e-8
    nonneg = adv_NT >= 0
    k = torch.where(nonneg, torch.full_like(log_w, pos[0]), torch.full_like(log_w, neg[0]))
    lam = torch.where(nonneg, torch.full_like(log_w, pos[1]), torch.full_like(log_w, neg[1])).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))  # VESPO: phi(w) = e^lam w^k e^(-lam w)
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@torch.no_grad()
def sampler_log_weight(w_NT: torch.Tensor) -> torch.Tensor:
    """``(N,)``: ``sum_t clamp(log w_t, log 1e-8, 20)`` of per-token TIS weights (1 on padding, so
    padding adds 0), the sampler's share of VESPO's ``log w`` (TRL's ``token_*`` modes)."""
    return torch.log(w_NT.float()).clamp(LOG_W_MIN, LOG_W_MAX).sum(dim=1)


@torch.no_grad()
def vespo_metrics(ratio_NT: torch.Tensor, adv_NT: torch.Tensor, c: ClipSettings) -> dict[str, float]:
    """``vespo/phi_seq_mean``: the weight's mean over the completions (TRL's name)."""
    p = _params(c)
    phi_N = gamma_weight(ratio_NT[:, :1], adv_NT[:, :1], p.vespo_pos, p.vespo_neg)
    return {"vespo/phi_seq_mean": phi_N.mean().item()}


def _params(c: ClipSettings) -> VESPOParams:
    return c.params if c.params is not None else VESPOParams()


SPEC = ObjectiveSpec(
    params=VESPOParams,
    config_errors=vespo_config_errors,
    clipped=no_clipping,
    metrics=vespo_metrics,
    sampler_weight=sampler_log_weight,
)


@register_objective("vespo", SPEC)
def vespo_surrogate(
    ratio_NT: torch.Tensor, adv_NT: torch.Tensor, logp_NT: torch.Tensor, c: ClipSettings
) -> torch.Tensor:
    """VESPO: ``sg(phi(w)) A log pi_theta`` (see the module docstring); needs ``ratio_level="trajectory"``."""
    if c.ratio_level != "trajectory":
        raise ValueError(
            f"objective vespo weighs each sequence by its trajectory ratio; got ratio_level={c.ratio_level!r}"
        )
    p = _params(c)
    return gamma_weight(ratio_NT, adv_NT, p.vespo_pos, p.vespo_neg) * adv_NT * logp_NT
