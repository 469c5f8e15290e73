"""SAPO (Gao et al., Soft Adaptive Policy Optimization, arXiv 2511.20347): ``f(rho) A`` with the soft
gate ``f(x) = sigmoid(tau (x - 1)) 4 / tau``, ``tau = tau_pos`` where ``A > 0``, else ``tau_neg``.

Its gradient ``4 sigmoid(1 - sigmoid) rho grad log pi A`` equals REINFORCE's at ``rho = 1`` and fades
smoothly off-policy instead of stopping at a hard boundary; ``tau_neg > tau_pos`` fades negative
updates faster. Its parameters are ``algo.sapo_tau_pos`` and ``algo.sapo_tau_neg`` (``SAPOParams``); it
clips nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .registry import ObjectiveSpec, register_objective
from .settings import ClipSettings, no_clipping


@dataclass(frozen=True)
class SAPOParams:
    """SAPO's gate temperatures (the config's fields of the same names)."""

    sapo_tau_pos: float = 1.0  # where A > 0 (the paper's 1.0)
    sapo_tau_neg: float = 1.05  # where A <= 0 (the paper's 1.05)


def sapo_config_errors(a) -> list[str]:
    """The temperatures must be positive (checked whatever the objective: a typo is caught before it is used)."""
    if a.sapo_tau_pos > 0 and a.sapo_tau_neg > 0:
        return []
    return [
        f"algo.sapo_tau_pos={a.sapo_tau_pos} and algo.sapo_tau_neg={a.sapo_tau_neg} must be > 0 (the paper uses 1.0 "
        "and 1.05)"
    ]


@register_objective("sapo", ObjectiveSpec(params=SAPOParams, config_errors=sapo_config_errors, clipped=no_clipping))
def sapo_surrogate(
    ratio_NT: torch.Tensor, adv_NT: torch.Tensor, logp_NT: torch.Tensor, c: ClipSettings
) -> torch.Tensor:
    """The soft gate times the advantage (module docstring); ``c.params`` is a ``SAPOParams``."""
    p = c.params if c.params is not None else SAPOParams()
    if p.sapo_tau_pos <= 0 or p.sapo_tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={p.sapo_tau_pos}, tau_neg={p.sapo_tau_neg}")
    tau_NT = torch.where(adv_NT > 0, torch.full_like(adv_NT, p.sapo_tau_pos), torch.full_like(adv_NT, p.sapo_tau_neg))
    gate_NT = torch.sigmoid(tau_NT * (ratio_NT - 1.0)) * (4.0 / tau_NT)  # SAPO: soft gate f(r) = sigma(tau(r-1)) 4/tau
    return gate_NT * adv_NT
