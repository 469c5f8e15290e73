"""From a scored batch to the update's inputs: the glue where the variants meet, owned in one place.

    rewards_N   <- the batch's weighted rewards, then the reward stages in order:
                   MO-GRPO component normalisation (reward.normalize_components),
                   KL in the reward (algo.kl_placement=reward, PPO / REINFORCE++)
    advantages  <- the registered advantage estimator (``advantage_name``: process supervision,
                   GiGPO / GAGPO credit, GTPO / GRPO-S shaping, or the group baseline/scale family),
                   then EDGE's entropy-scaled advantage and TIS's per-token weights
    loss_mask   <- completion_mask narrowed by every active token mask (DAPO overlong, entropy
                   top-fraction, the user's ``algo.token_masks``)
    loss        <- LossSettings (objective, ratio level, clip, KL placement, entropy bonus), Normalisers

``update_inputs(settings, scored, tokens, logprobs)`` is a function of its arguments only (the
learnable lambda of lambda-GRPO and the distributed context ride in ``settings``); the training
step calls it between the logprobs and the optimizer step, and tests call it on hand-built tensors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .estimators import turn_ids  # importing estimators registers the built-in stages
from .advantages import entropy_scaled_advantages, kl_penalized_rewards, normalize_components, response_entropy
from .registry import lookup
from .settings import ClipSettings, EntropyBonus, KLSettings, LossSettings, Normalisers
from .tis import pad_sampling_logprobs, tis_weights
from grpokit.types import TokenBatch


@dataclass(frozen=True)
class StepSettings:
    """The algorithm settings record: ``algo`` (an ``AlgoConfig``) plus what the run adds to it."""

    algo: Any  # config.sections.AlgoConfig
    component_weights: tuple[float, ...] | None = None  # MO-GRPO: each reward function's weight (None: off)
    process_fn: Callable | None = None  # algo.supervision=process: the process reward
    tis_cap: float = 0.0  # > 0: TIS weights capped at this (only when the sampler is not the trainer's forward)
    norm_constant: float = 1.0  # Dr. GRPO's C: algo.norm_constant or rollout.max_new_tokens
    dist: Any = None  # a distributed.DistContext; None: one process
    lam: Any = None  # lambda-GRPO's LearnableLambda (aggregation=lambda-grpo)


@dataclass(frozen=True)
class LogProbs:
    """Log-probabilities taken before the update, ``(N, T)`` each; None where not needed."""

    old: torch.Tensor | None = None  # pi_old (None: on-policy, mu = 1, the update's own forward is pi_old)
    ref: torch.Tensor | None = None  # pi_ref (beta > 0)
    entropy: torch.Tensor | None = None  # pi_old's token entropies


@dataclass
class UpdateInputs:
    """Everything one optimizer step needs, for the whole batch of N sequences."""

    batch: TokenBatch
    advantages: torch.Tensor  # (N,) or (N, T)
    loss_mask: torch.Tensor  # (N, T) completion tokens that count in the loss
    old_logp: torch.Tensor | None  # (N, T); None: the current policy is the old policy (mu = 1)
    ref_logp: torch.Tensor | None  # (N, T) when the KL is in the loss
    turn_ids: torch.Tensor | None = None  # (N, T) turn of every token of an episode (ratio_level="turn")
    seq_weights: Callable[[slice], torch.Tensor] | None = None  # rows -> (n,) lambda-GRPO weights
    loss: LossSettings | None = None  # None: built from the AlgoConfig passed to policy_update
    norms: Normalisers | None = None  # aggregation and norm_constant (counts are the update's)
    metrics: dict[str, float] = field(default_factory=dict)  # what the stages measured


@dataclass(frozen=True)
class AdvantageContext:
    """What an advantage estimator may read."""

    algo: Any
    scored: Any  # rollout.collect.ScoredBatch
    rewards_N: torch.Tensor  # (N,) after the reward stages, CPU
    mask_NT: torch.Tensor  # (N, T) completion mask
    entropy_NT: torch.Tensor | None
    group_size: int
    dist: Any
    process_fn: Callable | None = None


@dataclass(frozen=True)
class MaskContext:
    """What a token mask may read; ``mask_NT`` is the mask so far."""

    algo: Any
    mask_NT: torch.Tensor  # (N, T)
    entropy_NT: torch.Tensor | None
    finish_reasons: list[str]
    dist: Any


class _OneProcess:
    """The distributed context of a single process: every collective is the identity."""

    active = False

    @staticmethod
    def gather_rows(x):
        return x

    local_rows = gather_varlen = gather_rows


def advantage_name(a) -> str:
    """The registered advantage estimator ``algo`` selects: ``algo.advantage`` when set, else the
    one its older fields name (supervision, credit, entropy_shaping), else the group family."""
    if a.advantage:
        return a.advantage
    if a.supervision == "process":
        return "process"
    if a.credit != "outcome":
        return a.credit
    return a.entropy_shaping if a.entropy_shaping != "none" else "group"


def mask_names(a) -> list[str]:
    """The token masks ``algo`` turns on, in the order they apply."""
    return ["overlong"] * a.mask_truncated + ["entropy_top"] * (a.entropy_top_fraction < 1) + list(a.token_masks)


def _plugged(a) -> bool:
    return bool(a.advantage or a.token_masks or a.objective not in ("clip", "cispo", "sapo"))


def needed_logprobs(s: StepSettings) -> tuple[bool, bool, bool]:
    """``(old, ref, entropy)``: which log-probabilities the step must take before the update. A
    plugin stage gets all of them (its needs are unknown)."""
    a = s.algo
    entropy = a.entropy_top_fraction < 1 or a.entropy_advantage or a.entropy_shaping != "none" or _plugged(a)
    old = a.num_iterations > 1 or entropy or a.kl_placement == "reward" or s.tis_cap > 0
    return old, a.beta > 0, entropy


def loss_settings(a) -> tuple[LossSettings, Normalisers]:
    """The objective's records from ``AlgoConfig`` (0 means "off" in the config, None here); the KL
    term is in the loss only with ``kl_placement=loss``."""
    beta = a.beta if a.kl_placement == "loss" else 0.0
    return LossSettings(
        ClipSettings(a.objective, a.clip_low, a.clip_high, a.dual_clip or None, a.ratio_level, a.sapo_tau_pos, a.sapo_tau_neg),
        KLSettings(beta, a.kl_estimator, a.kl_bias_correction, a.kl_clamp or None),
        EntropyBonus(a.entropy_coef, a.entropy_aggregation), a.offpolicy_delta or None,
    ), Normalisers(a.aggregation)


def update_inputs(s: StepSettings, scored, tokens: TokenBatch, lp: LogProbs) -> UpdateInputs:
    """The update's inputs for one step's ``scored`` batch (see the module docstring for the order)."""
    a, dist = s.algo, s.dist or _OneProcess()
    G, mask = scored.group_size, tokens.completion_mask
    rewards_N, metrics = reward_stages(s, scored, tokens, lp)
    ctx = AdvantageContext(a, scored, rewards_N, mask, lp.entropy, G, dist, s.process_fn)
    advantages, adv_metrics = lookup("advantage", advantage_name(a))(ctx)
    advantages, post_metrics = advantage_stages(s, advantages, scored, tokens, lp, dist)
    loss_mask = mask
    for name in mask_names(a):
        loss_mask = lookup("token mask", name)(MaskContext(a, loss_mask, lp.entropy, scored.rollout.finish_reasons, dist))
    loss, norms = loss_settings(a)
    return UpdateInputs(
        tokens, advantages.to(mask.device), loss_mask, lp.old, lp.ref if loss.kl.beta else None,
        turn_ids(scored.rollout, tokens.width).to(mask.device) if a.ratio_level == "turn" else None,
        s.lam.weight_fn(mask.sum(dim=1), G) if s.lam is not None else None,
        loss, dataclasses.replace(norms, norm_constant=s.norm_constant), {**adv_metrics, **metrics, **post_metrics})


def reward_stages(s: StepSettings, scored, tokens: TokenBatch, lp: LogProbs) -> tuple[torch.Tensor, dict[str, float]]:
    """``(rewards_N, metrics)``: the weighted rewards after MO-GRPO's per-component normalisation and
    the KL-in-reward penalty, each when configured."""
    a, G = s.algo, scored.group_size
    rewards_N, metrics = scored.total_N, {}
    if s.component_weights is not None:  # MO-GRPO: each component normalised within its group
        w = torch.tensor(s.component_weights)
        rewards_N = normalize_components(scored.rewards_NF.view(-1, G, len(w)), w, std=a.std, eps=a.adv_eps).flatten()
    if a.kl_placement == "reward" and lp.ref is not None:  # PPO / REINFORCE++: KL in the reward
        mask = tokens.completion_mask.cpu()
        rewards_N, kl_N = kl_penalized_rewards(rewards_N, lp.old.cpu(), lp.ref.cpu(), mask, a.beta, a.kl_estimator,
                                               a.kl_clamp or None)
        metrics["kl"] = (kl_N.sum() / mask.sum().clamp(min=1)).item()
    return rewards_N, metrics


def advantage_stages(s: StepSettings, advantages: torch.Tensor, scored, tokens: TokenBatch, lp: LogProbs,
                     dist) -> tuple[torch.Tensor, dict[str, float]]:
    """EDGE-GRPO's entropy-scaled advantage and TIS's per-token weights, each when configured."""
    a, metrics = s.algo, {}
    if a.entropy_advantage:  # EDGE-GRPO: entropy-driven advantage, batch-wide mean entropy
        ent_N = response_entropy(lp.entropy.float().cpu(), tokens.completion_mask.float().cpu())
        advantages, m = entropy_scaled_advantages(advantages, ent_N, dist.gather_rows(ent_N).mean(),
                                                  a.entropy_advantage_max_scale or None)
        metrics.update(m)
    if s.tis_cap > 0:  # TIS: the sampler was not exactly pi_old (vLLM numerics, stale weights)
        sampler = pad_sampling_logprobs(scored.rollout.sampling_logprobs, tokens.width).to(lp.old.device)
        w_NT, m = tis_weights(lp.old, sampler, tokens.completion_mask, s.tis_cap)
        advantages = (advantages[:, None] if advantages.dim() == 1 else advantages).to(w_NT.device) * w_NT
        metrics.update(m)
    return advantages, metrics
