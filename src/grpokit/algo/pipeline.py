"""From a scored batch to the update's inputs: the glue where the variants meet, owned in one place.

    rewards_N   <- the batch's weighted rewards, then the reward stages in order:
                   MO-GRPO component normalisation (reward.normalize_components),
                   KL in the reward (algo.kl_placement=reward, PPO / REINFORCE++)
    advantages  <- the advantage estimator ``algo.advantage`` names (the group baseline/scale family,
                   process supervision, GiGPO / GAGPO credit, GTPO / GRPO-S shaping, or a plugin), fed
                   NaN for an unscorable completion (every reward function returned None), which it
                   leaves out of its statistics and gives advantage 0 (TRL's rule),
                   then EDGE's entropy-scaled advantage and on-policy distillation's per-token reward
    policy_weight <- the sampler corrections, each a per-token factor of the policy term: TIS's weights
                   and IcePop / MIS masking (a weight 0, not a loss-mask entry: the masked token keeps
                   its place in the normaliser and the KL term, as in IcePop's objective); a weight,
                   not a change of the advantage, so what reads the advantage's sign (the clip
                   metrics, the off-policy mask) sees the estimator's, as TRL; it weighs the whole
                   advantage, distillation's per-token reward included (all of it sampled by the sampler)
    loss_mask   <- completion_mask narrowed by every active token mask (DAPO overlong, the user's
                   ``algo.token_masks``); policy_mask <- the loss mask narrowed by the policy-only ones
                   (the entropy top-fraction): only the policy term reads it
    loss        <- LossSettings (objective, ratio level, clip, KL placement, entropy bonus), Normalisers

Each stage is registered with its ``StageSpec`` (registry.py): the built-in reward, advantage and
mask stages run while their own switch (``StageSpec.active``) is on, in registration order, and what
they read (pi_old, the entropies) is declared there, so no list of stage names lives here.

``update_inputs(settings, scored, tokens, logprobs)`` is a function of its arguments only (the
learnable lambda of lambda-GRPO and the distributed context ride in ``settings``); the training
step calls it between the logprobs and the optimizer step, and tests call it on hand-built tensors.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from grpokit.config.sections import AlgoConfig
from grpokit.types import Rollout, ScoredBatch, TokenBatch

from .advantages import entropy_scaled_advantages, kl_penalized_rewards, normalize_components, response_entropy
from .contexts import AdvantageContext, Collectives, MaskContext, OneProcess, part_weights
from .estimators import turn_ids  # importing estimators registers the built-in stages
from .lambda_grpo import LearnableLambda
from .masks import ended_rows
from .registry import (
    StageSpec,
    active_stages,
    lookup,
    objective_spec,
    register_advantage_stage,
    register_policy_weight,
    register_reward_stage,
    stage_spec,
)
from .settings import ClipSettings, EntropyBonus, KLSettings, LossSettings, Normalisers
from .tis import mismatch_mask, pad_sampling_logprobs, sampled_rows, tis_weights

if TYPE_CHECKING:  # distill.py registers its stage last (the bottom of this file)
    from .distill import TeacherTopK


@dataclass(frozen=True)
class TISSettings:
    """Truncated importance sampling (rollout.tis_cap, tis_mode, tis_min; algo/tis.py)."""

    cap: float = 0.0  # > 0: weights capped at this (only when the sampler is not the trainer's forward)
    mode: str = "token_truncate"  # token_truncate, token_mask, sequence_truncate or sequence_mask
    floor: float = 0.0  # the *_mask modes: weights below this leave the gradient


@dataclass(frozen=True)
class MismatchSettings:
    """IcePop / MIS (rollout.mismatch_mask, mismatch_low, mismatch_high): the ratio pi_old / pi_sampler
    counted as matching is ``[low, high]``."""

    mode: str = "none"  # "none" (measured only), "token" or "sequence" (tis.mismatch_mask)
    low: float = 0.5
    high: float = 2.0


@dataclass(frozen=True)
class StepSettings:
    """The algorithm settings record: ``algo`` (an ``AlgoConfig``) plus what the run adds to it."""

    algo: AlgoConfig
    component_weights: tuple[float, ...] | None = None  # MO-GRPO: each reward function's weight (None: off)
    process_fn: Callable | None = None  # algo.advantage=process: the process reward
    norm_constant: float = 1.0  # Dr. GRPO's C: algo.norm_constant or rollout.max_new_tokens
    dist: Collectives | None = None  # a distributed.DistContext; None: one process
    lam: LearnableLambda | None = None  # lambda-GRPO's learnable lambda (aggregation=lambda-grpo)
    mismatch: MismatchSettings = MismatchSettings()
    tis: TISSettings = TISSettings()
    sampler_truncates: bool = False  # rollout top-k / top-p / min-p: the sampler's logprobs are renormalised
    # over a truncated support, so pi_old is taken before the update with its mass on that support (LogProbs)
    end_ids: frozenset[int] = frozenset()  # the ids that end a completion (EOS and pad): algo.truncated_by=last_token
    stale_slices: bool = False  # an update falls between the batch's sampling and one of its slices (TRL's
    # steps_per_generation > gradient_accumulation_steps; train/update_windows.stale_slices): pi_old from before it


@dataclass(frozen=True)
class LogProbs:
    """Log-probabilities taken before the update, ``(N, T)`` each; None where not needed."""

    old: torch.Tensor | None = None  # pi_old (None: on-policy, mu = 1, the update's own forward is pi_old)
    ref: torch.Tensor | None = None  # pi_ref (beta > 0)
    entropy: torch.Tensor | None = None  # pi_old's token entropies
    support_mass: torch.Tensor | None = None  # log of pi_old's mass on the sampler's truncated support
    # (top-k / top-p / min-p replayed on pi_old's logits; None: untruncated sampling)
    teacher_top_k: TeacherTopK | None = None  # algo.distill_top_k: the teacher's k likeliest tokens, (N, T, K)

    def on_support(self) -> torch.Tensor | None:
        """``(N, T)`` log pi_old renormalised over the sampler's support: what TIS, IcePop / MIS and the
        mismatch metrics compare with the sampler's logprobs (``old`` itself when sampling truncates nothing)."""
        return on_support(self.old, self.support_mass)


def on_support(old_logp: torch.Tensor | None, support_mass: torch.Tensor | None) -> torch.Tensor | None:
    """``log pi_old - log mass``: pi_old renormalised over the tokens the sampler's truncation kept
    (rollout/sampling.py ``support_log_mass``), the trainer's side of the sampler ratio."""
    if old_logp is None or support_mass is None:
        return old_logp
    return old_logp - support_mass.to(old_logp)


@dataclass
class UpdateInputs:
    """Everything one optimizer step needs, for the whole batch of N sequences."""

    batch: TokenBatch
    advantages: torch.Tensor  # (N,) or (N, T)
    loss_mask: torch.Tensor  # (N, T) completion tokens that count in the loss: normalisers, KL, metrics
    old_logp: torch.Tensor | None  # (N, T); None: the current policy is the old policy (mu = 1)
    ref_logp: torch.Tensor | None  # (N, T) when the KL is in the loss
    policy_mask: torch.Tensor | None = None  # (N, T) tokens whose policy term (surrogate, entropy bonus) counts,
    # within loss_mask: a policy-only token mask's (entropy top-fraction); None: all of loss_mask
    policy_weight: torch.Tensor | None = None  # (N, T) the sampler corrections' factor of each token's surrogate
    # (TIS, IcePop / MIS: the policy weights, multiplied); None: none runs
    turn_ids: torch.Tensor | None = None  # (N, T) turn of every token of an episode (ratio_level="turn")
    seq_weights: Callable[[slice], torch.Tensor] | None = None  # rows -> (n,) lambda-GRPO weights
    loss: LossSettings | None = None  # the objective's records (update_inputs sets them; loss_settings makes them)
    norms: Normalisers | None = None  # aggregation and norm_constant (counts are the update's)
    metrics: dict[str, float] = field(default_factory=dict)  # what the stages measured
    sampler_logp: torch.Tensor | None = None  # (N, T) the sampler's logprobs: mismatch/* metrics when given
    sampler_mask: torch.Tensor | None = None  # (N, T) tokens whose sampler logprob is real (None: completion_mask)
    mismatch: MismatchSettings = (
        MismatchSettings()
    )  # its [low, high] is the range counted as matching (mismatch/outside_fraction)
    sampler_log_weight: torch.Tensor | None = (
        None  # (N,) the sampler's correction inside the objective's ratio (ObjectiveSpec.sampler_weight)
    )
    support_mass: torch.Tensor | None = None  # (N, T) LogProbs.support_mass: the mismatch metrics' pi_old on support
    teacher_top_k: TeacherTopK | None = None  # algo.distill_top_k: the forward-KL term's teacher side (distill.py)

    @functools.cached_property
    def row_advantages(self) -> torch.Tensor:
        """(N,) on the CPU, once per batch: the advantage each row trains on, a token-level (N, T) one averaged over
        the row on its device first (N numbers cross, not N * T). samples.jsonl and grpokit.trl's _logs show it."""
        adv = self.advantages.detach()
        return (adv.float().mean(dim=1) if adv.dim() == 2 else adv.float()).cpu()


# where the beta-weighted KL goes, by config name (algo.kl_placement): beta -> (beta in the reward, beta in the loss)
KL_PLACEMENTS: dict[str, Callable[[float], tuple[float, float]]] = {
    "loss": lambda beta: (0.0, beta),  # GRPO: beta * KL_k per token in the loss
    "reward": lambda beta: (beta, 0.0),  # PPO / REINFORCE++: r -= beta * sum_t KL_k
}


def mask_names(s: StepSettings) -> list[str]:
    """The token masks ``s`` turns on, in the order they apply: the built-in ones whose switch is on,
    then ``algo.token_masks``."""
    return active_stages("token mask", s) + list(s.algo.token_masks)


def reward_stage_names(s: StepSettings) -> list[str]:
    """The reward stages ``s`` turns on, in order (MO-GRPO's, then the KL in the reward)."""
    return active_stages("reward stage", s)


def advantage_stage_names(s: StepSettings) -> list[str]:
    """The advantage stages ``s`` turns on, in order (EDGE's entropy scaling, distillation's reward)."""
    return active_stages("advantage stage", s)


def policy_weight_names(s: StepSettings) -> list[str]:
    """The policy weights ``s`` turns on (TIS, IcePop / MIS)."""
    return active_stages("policy weight", s)


def stage_specs(s: StepSettings) -> list[StageSpec]:
    """The declarations of every stage ``s`` runs besides the objective: its estimator, masks, reward and
    advantage stages and policy weights."""
    return (
        [stage_spec("advantage", s.algo.advantage)]
        + [stage_spec("token mask", n) for n in mask_names(s)]
        + [stage_spec("reward stage", n) for n in reward_stage_names(s)]
        + [stage_spec("advantage stage", n) for n in advantage_stage_names(s)]
        + [stage_spec("policy weight", n) for n in policy_weight_names(s)]
    )


def needed_logprobs(s: StepSettings) -> tuple[bool, bool, bool]:
    """``(old, ref, entropy)``: which log-probabilities the step must take before the update, from what
    the running stages declare (registry.StageSpec, ObjectiveSpec). A plugin stage that declared
    nothing gets all of them (its needs are unknown)."""
    a, specs = s.algo, stage_specs(s)
    unknown = not objective_spec(a.objective).declared or any(not spec.declared for spec in specs)
    entropy = unknown or any(spec.needs_entropy for spec in specs)
    old = a.num_iterations > 1 or entropy or s.tis.cap > 0 or any(spec.needs_old for spec in specs)
    old = old or s.sampler_truncates  # the sampler ratio needs pi_old's mass on the truncated support
    old = old or s.stale_slices  # a slice trained after an update: its ratio is to the policy that sampled it
    return old, a.beta > 0 or a.distill_coef > 0, entropy  # the teacher's logprobs are the reference's


def loss_settings(a: AlgoConfig) -> tuple[LossSettings, Normalisers]:
    """The objective's records from ``AlgoConfig`` (0 means "off" in the config, None here); the KL
    term is in the loss only with ``kl_placement=loss``."""
    beta = KL_PLACEMENTS[a.kl_placement](a.beta)[1]
    return LossSettings(
        clip=ClipSettings(
            objective=a.objective,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip or None,
            ratio_level=a.ratio_level,
            params=objective_params(a),
        ),
        kl=KLSettings(
            beta=beta, estimator=a.kl_estimator, bias_correction=a.kl_bias_correction, clamp=a.kl_clamp or None
        ),
        entropy=EntropyBonus(coef=a.entropy_coef, aggregation=a.entropy_aggregation, adaptive=a.entropy_adaptive),
        offpolicy_delta=a.offpolicy_delta or None,
    ), Normalisers(aggregation=a.aggregation)


def objective_params(a: AlgoConfig) -> object | None:
    """The chosen objective's own parameters, read from the config fields its params record names."""
    return _params_from(objective_spec(a.objective).params, a)


def advantage_params(a: AlgoConfig) -> object | None:
    """The chosen advantage estimator's own parameters, read from the config fields its params record names."""
    return _params_from(stage_spec("advantage", a.advantage).params, a)


def _params_from(cls, a: AlgoConfig) -> object | None:
    return cls(**{f.name: getattr(a, f.name) for f in dataclasses.fields(cls)}) if cls is not None else None


def update_inputs(s: StepSettings, scored: ScoredBatch, tokens: TokenBatch, lp: LogProbs) -> UpdateInputs:
    """The update's inputs for one step's ``scored`` batch (see the module docstring for the order)."""
    a, dist = s.algo, s.dist or OneProcess()
    if a.distill_top_k > 0 and lp.teacher_top_k is None:  # never train without the term the config asks for
        raise ValueError(
            f"algo.distill_top_k={a.distill_top_k} needs the teacher's top-k (train/distill_pass.py's teacher_top_k), "
            "which this path did not compute; set algo.distill_top_k=0 here"
        )
    G, mask = scored.group_size, tokens.completion_mask
    sampler = sampler_record(scored.rollout, tokens)  # padded once: TIS, IcePop / MIS and the mismatch metrics read it
    stage_ctx, rewards_N, metrics = StageContext(s, scored, tokens, lp, dist, *sampler), scored.total_N, {}
    for name in reward_stage_names(s):
        rewards_N, m = lookup("reward stage", name)(stage_ctx, rewards_N)
        metrics.update(m)
    rewards_N = torch.where(scored.scored_N, rewards_N, torch.full_like(rewards_N, float("nan")))  # unscorable
    ctx = AdvantageContext(a, scored, rewards_N, mask, lp.entropy, G, dist, s.process_fn, advantage_params(a))
    advantages, adv_metrics = lookup("advantage", a.advantage)(ctx)
    _check_unscorable(advantages, ctx)
    post_metrics = {}
    for name in advantage_stage_names(s):
        advantages, m = lookup("advantage stage", name)(stage_ctx, advantages)
        post_metrics.update(m)
    policy_weight = policy_weights(stage_ctx, post_metrics)
    ended = ended_rows(scored.rollout.completion_ids, s.end_ids)
    loss_mask, policy_mask = token_masks(s, mask, lp.entropy, scored.rollout.finish_reasons, dist, ended)
    loss, norms = loss_settings(a)
    sampler_log_w, m = objective_sampler_weight(stage_ctx) if _tis_in_objective(s) else (None, {})
    post_metrics.update(m)
    return UpdateInputs(
        batch=tokens,
        advantages=advantages.to(mask.device),
        loss_mask=loss_mask,
        policy_mask=policy_mask,
        policy_weight=policy_weight,
        old_logp=lp.old,
        ref_logp=lp.ref if loss.kl.beta else None,
        turn_ids=turn_ids(scored.rollout, tokens.width).to(mask.device) if a.ratio_level == "turn" else None,
        seq_weights=s.lam.weight_fn(mask.sum(dim=1), G) if s.lam is not None else None,
        loss=loss,
        norms=dataclasses.replace(norms, norm_constant=s.norm_constant),
        metrics={**adv_metrics, **metrics, **post_metrics},
        sampler_logp=sampler[0],
        sampler_mask=sampler[1],
        mismatch=s.mismatch,
        sampler_log_weight=sampler_log_w,
        support_mass=lp.support_mass,
        teacher_top_k=lp.teacher_top_k,
    )


def token_masks(
    s: StepSettings,
    mask: torch.Tensor,
    entropy: torch.Tensor | None,
    finish_reasons: list[str],
    dist: Collectives,
    ended: list[bool] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(loss_mask, policy_mask)`` ``(N, T)`` from the completion mask and every active token mask, in
    order: a mask whose spec says ``policy_only`` (the entropy top-fraction) narrows the policy mask only
    (its tokens keep their KL term and their place in the normalisers, as TRL's entropy mask), any other
    (DAPO's overlong filter, a plugin by default) narrows the loss mask, as if its tokens were never
    sampled. ``policy_mask`` is None when no policy-only mask ran (the policy term covers the loss mask)."""
    loss_mask, policy_mask = mask, None
    for name in mask_names(s):
        policy_only = stage_spec("token mask", name).policy_only
        so_far = loss_mask if policy_mask is None else policy_mask * loss_mask
        narrowed = lookup("token mask", name)(MaskContext(s.algo, so_far, entropy, finish_reasons, dist, ended))
        if policy_only:
            policy_mask = narrowed
        else:
            loss_mask = narrowed
    return loss_mask, policy_mask * loss_mask if policy_mask is not None else None


def policy_weights(ctx: StageContext, metrics: dict[str, float]) -> torch.Tensor | None:
    """The product ``(N, T)`` of the policy weights ``ctx.settings`` turns on (None: none), their metrics
    added to ``metrics``."""
    weight = None
    for name in policy_weight_names(ctx.settings):
        w_NT, m = lookup("policy weight", name)(ctx)
        weight = w_NT if weight is None else weight * w_NT.to(weight)
        metrics.update(m)
    return weight


def _check_unscorable(advantages: torch.Tensor, ctx: AdvantageContext) -> None:
    """An estimator that reads ``rewards_N`` must leave the unscorable rows (NaN there) out of its statistics:
    one that let the NaN through is refused in one sentence instead of training on NaN."""
    unscored = int((~ctx.scored_N).sum())
    if unscored and not bool(torch.isfinite(advantages).all()):
        raise ValueError(
            f"advantage estimator {ctx.algo.advantage!r} returned non-finite advantages: {unscored} completion(s) "
            "of this batch are unscorable (every reward function returned None) and ctx.rewards_N is NaN there; "
            "leave those rows (ctx.scored_N False) out of its statistics and give them advantage 0"
        )


def sampler_record(rollout: Rollout, tokens: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sampler_logp, sampler_mask)``, ``(N, T)`` each: the sampler's logprobs of the completion
    tokens, and the model's tokens of rows the sampler scored (tis.sampled_rows)."""
    mask = tokens.completion_mask
    sampler = pad_sampling_logprobs(rollout.sampling_logprobs, tokens.width).to(mask.device)
    return sampler, mask * sampled_rows(rollout.sampling_logprobs).to(mask)[:, None]


@dataclass(frozen=True)
class StageContext:
    """What the reward stages (before the estimator) and advantage stages (after it) read."""

    settings: StepSettings
    scored: ScoredBatch
    tokens: TokenBatch
    logprobs: LogProbs
    dist: Collectives
    sampler_logp: torch.Tensor  # (N, T) the sampler's logprobs of the completion tokens (sampler_record)
    sampler_mask: torch.Tensor  # (N, T) the model's tokens of the rows the sampler scored


@register_reward_stage("normalize_components", StageSpec(active=lambda s: s.component_weights is not None))
def mo_grpo_rewards(ctx: StageContext, rewards_N: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """MO-GRPO (reward.normalize_components): each reward component normalised within its group,
    then the weighted sum."""
    a, G, w = ctx.settings.algo, ctx.scored.group_size, torch.tensor(ctx.settings.component_weights)
    return normalize_components(ctx.scored.rewards_NF.view(-1, G, len(w)), w, std=a.std, eps=a.adv_eps).flatten(), {}


@register_reward_stage(
    "kl_in_reward", StageSpec(needs_old=True, active=lambda s: KL_PLACEMENTS[s.algo.kl_placement](s.algo.beta)[0] > 0)
)
def kl_in_reward(ctx: StageContext, rewards_N: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO / REINFORCE++ (algo.kl_placement=reward): ``r -= beta * sum_t KL_k(pi_old || pi_ref)``."""
    a, lp, mask = ctx.settings.algo, ctx.logprobs, ctx.tokens.completion_mask.cpu()
    rewards_N, kl_N = kl_penalized_rewards(
        rewards_N, lp.old.cpu(), lp.ref.cpu(), mask, a.beta, a.kl_estimator, a.kl_clamp or None
    )
    kl = {"kl": (kl_N.sum() / mask.sum().clamp(min=1)).item()}  # per token of this rank: the job's, token-weighted
    return rewards_N, {**kl, **part_weights({"kl": mask.sum()})}


@register_advantage_stage(
    "entropy_advantage", StageSpec(needs_entropy=True, active=lambda s: bool(s.algo.entropy_advantage))
)
def edge_advantages(ctx: StageContext, advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """EDGE-GRPO (algo.entropy_advantage): A_i over its completion's entropy relative to the
    batch-wide mean entropy."""
    a = ctx.settings.algo
    ent_N = response_entropy(ctx.logprobs.entropy.float().cpu(), ctx.tokens.completion_mask.float().cpu())
    adv, metrics = entropy_scaled_advantages(
        advantages, ent_N, ctx.dist.gather_rows(ent_N).mean(), a.entropy_advantage_max_scale or None
    )
    return adv, {**metrics, **part_weights({"eda/scale": len(ent_N)})}  # over this rank's completions


@register_policy_weight("tis", StageSpec(needs_old=True, active=lambda s: s.tis.cap > 0 and not _tis_in_objective(s)))
def tis_policy_weight(ctx: StageContext) -> tuple[torch.Tensor, dict[str, float]]:
    """TIS (rollout.tis_cap, tis_mode, tis_min): the sampler was not exactly pi_old (vLLM numerics, stale
    weights), so every token's policy term is weighted by ``min(pi_old / pi_sampler, cap)``, or by
    another of TRL's corrections (tis.py)."""
    old = ctx.logprobs.on_support()
    tis = ctx.settings.tis
    w_NT, metrics = tis_weights(
        old, ctx.sampler_logp.to(old.device), ctx.tokens.completion_mask, tis.cap, tis.mode, tis.floor
    )
    return w_NT.to(ctx.tokens.completion_mask.device), _by_tokens(ctx, metrics)


def _by_tokens(ctx: StageContext, metrics: dict[str, float]) -> dict[str, float]:
    """A stage's token statistics of this rank, each with the rank's completion tokens as its weight (the step's
    reduction over ranks pools them: contexts.part_weights)."""
    return {**metrics, **part_weights(dict.fromkeys(metrics, ctx.tokens.completion_mask.sum()))}


def _tis_in_objective(s: StepSettings) -> bool:
    """TIS is on and the objective takes the sampler's correction inside its ratio (VESPO, as TRL)."""
    return s.tis.cap > 0 and objective_spec(s.algo.objective).sampler_weight is not None


def objective_sampler_weight(ctx: StageContext) -> tuple[torch.Tensor, dict[str, float]]:
    """The sampler's correction as the objective's own log weight ``(N,)`` (ObjectiveSpec.sampler_weight)
    instead of a weight on the advantages; ``token_*`` modes only."""
    s, old = ctx.settings, ctx.logprobs.on_support()
    if s.tis.mode.startswith("sequence"):
        raise ValueError(
            f"objective {s.algo.objective} takes the sampler correction per token; got tis_mode={s.tis.mode!r} "
            "(valid: token_truncate, token_mask)"
        )
    w_NT, metrics = tis_weights(
        old, ctx.sampler_logp.to(old.device), ctx.tokens.completion_mask, s.tis.cap, s.tis.mode, s.tis.floor
    )
    return objective_spec(s.algo.objective).sampler_weight(w_NT), _by_tokens(ctx, metrics)


@register_policy_weight("mismatch_mask", StageSpec(needs_old=True, active=lambda s: s.mismatch.mode != "none"))
def mismatch_policy_weight(ctx: StageContext) -> tuple[torch.Tensor, dict[str, float]]:
    """IcePop / MIS (rollout.mismatch_mask): tokens (or whole rows) where the sampler and pi_old
    disagree beyond ``[low, high]`` leave the policy gradient, weight 0 (tis.mismatch_mask)."""
    m = ctx.settings.mismatch
    keep_NT, metrics = mismatch_mask(
        ctx.logprobs.on_support(), ctx.sampler_logp, ctx.sampler_mask, m.mode, m.low, m.high
    )
    return keep_NT.to(ctx.tokens.completion_mask.device), _by_tokens(ctx, metrics)


from . import distill  # noqa: E402,F401  (registers on-policy distillation's advantage stage, last)
