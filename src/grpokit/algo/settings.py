"""Small frozen records that group the objective's settings, so no loss function takes two dozen
keywords. Each record is one concern: the surrogate and its ratio (``ClipSettings``), the KL
penalty (``KLSettings``), the reduction to a scalar (``Normalisers``) and the entropy bonus
(``EntropyBonus``); ``LossSettings`` holds one of each. They are plain values: ``algo/pipeline.py``
builds them from ``AlgoConfig`` once per step, tests build them by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class ClipSettings:
    """What multiplies the advantage (``loss.surrogate``) and over which span the ratio is taken."""

    objective: str = "clip"  # a registered objective (registry.py): clip, cispo, sapo, vespo, or a plugin
    clip_low: float = 0.2  # ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.2  # > clip_low: DAPO's clip-higher; CISPO's truncation is 1 + clip_high
    dual_clip: float | None = None  # dual-clip PPO bound (> 1) for negative advantages; None = off
    # "token" (GRPO), "sequence" (GSPO-token), "sequence_whole" (GSPO, TRL), "turn" (GAGPO), "trajectory" (TIC-GRPO)
    ratio_level: str = "token"
    # the objective's own parameters (its ObjectiveSpec.params record, e.g. sapo.SAPOParams); None: its defaults
    params: Any = None


@dataclass(frozen=True)
class KLSettings:
    """The KL penalty to the reference policy inside the loss (beta = 0: none)."""

    beta: float = 0.0
    estimator: str = "k3"  # "k1", "k2" or "k3" (loss.kl_estimate)
    bias_correction: bool = False  # times the importance weight pi_theta / pi_old (DeepSeek-V3.2)
    clamp: float | None = None  # bound each token's estimate to [-clamp, clamp]; None = no bound


@dataclass(frozen=True)
class Normalisers:
    """How token losses become a scalar; counts of the *whole* batch, so micro-batches add up."""

    aggregation: str = "seq-mean-token-mean"  # one of loss.AGGREGATIONS
    num_sequences: float | None = None  # None: this batch's own count
    num_tokens: float | None = None  # None: this batch's own masked-token count
    norm_constant: float | None = None  # Dr. GRPO's constant C (seq-mean-token-sum-norm)
    # the policy mask's tokens (LossTensors.policy_mask), the entropy bonus's token mean divides by them;
    # None: this batch's own count of them, or num_tokens where no policy mask narrows the loss mask
    num_policy_tokens: float | None = None


@dataclass(frozen=True)
class EntropyBonus:
    """``coef * H`` subtracted from the loss, reduced with it ("loss", verl) or on its own ("token-mean", TRL)."""

    coef: float = 0.0
    aggregation: str = "loss"
    adaptive: bool = False  # the coefficient moves between optimizer steps (entropy_control.py): the step reports it


@dataclass(frozen=True)
class LossSettings:
    """Every setting of the policy objective; the default is GRPO's clipped surrogate without KL."""

    clip: ClipSettings = field(default_factory=ClipSettings)
    kl: KLSettings = field(default_factory=KLSettings)
    entropy: EntropyBonus = field(default_factory=EntropyBonus)
    offpolicy_delta: float | None = None  # DeepSeek-V3.2 off-policy sequence masking threshold; None = off


@dataclass(frozen=True)
class LossTensors:
    """The tensors of one (micro-)batch the objective reads: N sequences, T completion tokens."""

    logp: torch.Tensor  # (N, T) log pi_theta, with gradient
    old_logp: torch.Tensor  # (N, T) log pi_old, detached
    advantages: torch.Tensor  # (N,) or (N, T)
    mask: torch.Tensor  # (N, T) 1 on the tokens that count in the loss: normalisers, KL, metrics
    ref_logp: torch.Tensor | None = None  # (N, T) log pi_ref, read when kl.beta != 0
    entropy: torch.Tensor | None = None  # (N, T) token entropies, read when entropy.coef != 0
    turn_ids: torch.Tensor | None = None  # (N, T) turn of every token (ratio_level="turn")
    seq_weights: torch.Tensor | None = None  # (N,) lambda-GRPO weights (aggregation="lambda-grpo")
    ratio_mask: torch.Tensor | None = (
        None  # (N, T) the completion's tokens a sequence/turn/trajectory ratio spans (None: mask)
    )
    sampler_log_weight: torch.Tensor | None = (
        None  # (N,) an objective's share of TIS (ObjectiveSpec.sampler_weight), added to its log ratio
    )
    policy_mask: torch.Tensor | None = None  # (N, T) within mask: the tokens whose policy term (surrogate, entropy
    # bonus) counts, a policy-only token mask's (entropy top-fraction); None: all of mask
    # (N, T) >= 0: the sampler corrections' weight of each token's policy term (TIS, IcePop / MIS: pipeline's policy
    # weights), multiplying the objective, not the advantages (whose sign the clip metrics read); None: 1
    policy_weight: torch.Tensor | None = None


@torch.no_grad()
def no_clipping(ratio_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, c: ClipSettings):
    """``ObjectiveSpec.clipped`` of an objective whose weight fades the update smoothly (SAPO, VESPO):
    no token is clipped."""
    none = torch.zeros_like(mask_NT.bool())
    return none, none, {}
