"""CISPO (MiniMax-M1, arXiv 2506.13585, Sec. 3.1 eqs. 4-5): a REINFORCE term weighted by the
stop-gradient importance weight truncated from above, ``sg(min(rho, 1 + clip_high)) A log pi_theta``.

Its one parameter is the shared ``algo.clip_high`` (the weight cap ``1 + clip_high``, which may sit
below 1: TRL's epsilon_high < 1), so it declares no parameters of its own; it clips from above only,
whatever the sign of A, and reports TRL's ``cispo_clip_ratio``.
"""

from __future__ import annotations

import torch

from .registry import ObjectiveSpec, register_objective
from .settings import ClipSettings


@torch.no_grad()
def cispo_clipped(ratio_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, c: ClipSettings):
    """``(low, high, extra flags)``: no lower bound; the capped tokens, and TRL's ``cispo_clip_ratio``
    (the capped tokens with A > 0, counted like the clip ratios: loss.clip_metrics)."""
    m = mask_NT.bool()
    capped = (ratio_NT > 1.0 + c.clip_high) & m
    return torch.zeros_like(m), capped, {"cispo_clip_ratio": capped & (adv_NT > 0)}


@register_objective("cispo", ObjectiveSpec(min_clip_high=-1.0, clipped=cispo_clipped, clip_fields=("clip_high",)))
def cispo_surrogate(
    ratio_NT: torch.Tensor, adv_NT: torch.Tensor, logp_NT: torch.Tensor, c: ClipSettings
) -> torch.Tensor:
    """``sg(r_hat) A log pi_theta`` with ``r_hat = min(rho, 1 + clip_high)``. The weight carries no
    gradient, so every token keeps its gradient ``r_hat A grad log pi`` (PPO's clip zeroes it). The
    paper's ``r_hat`` is ``clip(rho, 1 - eps_low, 1 + eps_high)`` but it sets ``eps_low`` large, i.e. no
    lower bound; we take that setting, as TRL and the paper's runs do, so ``clip_low`` is not used here."""
    weight_NT = torch.clamp(ratio_NT, max=1.0 + c.clip_high).detach()  # CISPO (MiniMax-M1 eq. 5): sg(clipped IS weight)
    return weight_NT * adv_NT * logp_NT  # CISPO (eq. 4): REINFORCE term, no token's gradient dropped
