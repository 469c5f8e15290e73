"""The built-in stages of the registry (registry.py), each a small function of a context record.

Advantage estimators read an ``AdvantageContext`` (contexts.py) and return ``(advantages, metrics)``:
``(N,)`` per completion or ``(N, T)`` per token; ``algo.advantage`` names the one a run uses. Its
``rewards_N`` is NaN for an unscorable completion: every estimator here leaves it out and gives it 0
(the pure functions do, reading the NaN). Token masks read a ``MaskContext`` and return the narrowed
mask ``(N, T)``: the loss mask's, or the policy term's with ``StageSpec(policy_only=True)``. The math
lives in advantages.py, credit.py, entropy_shaping.py and masks.py; these functions only turn a scored
batch into those functions' tensors. Beside each, its
``StageSpec`` (registry.py) declares what it reads and checks its own config values (validation
runs every registered stage's ``config_errors``), so a pair it would silently ignore is refused in
one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.types import repeat_columns

from .advantages import group_advantages, process_advantages
from .contexts import part_weights
from .credit import gagpo_advantages, gigpo_advantages, steps_to_tokens
from .entropy_shaping import GTPO_NORMALIZATIONS, grpo_s_advantages, gtpo_advantages, gtpo_token_rewards
from .masks import entropy_token_mask, overlong_filter
from .registry import StageSpec, register_advantage, register_token_mask


@register_advantage("group", StageSpec())
def group_estimator(ctx) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's family: ``algo.baseline`` (group mean, RLOO's leave-one-out) and ``algo.scale``
    (group / batch std, none, REINFORCE++'s whitening), statistics over every rank's groups."""
    a, dist, G = ctx.algo, ctx.dist, ctx.group_size
    rewards_all = dist.gather_rows(ctx.rewards_N)  # data parallel: batch-wide statistics see every rank
    lengths = dist.gather_rows(ctx.mask_NT.sum(dim=1).cpu()).view(-1, G) if a.scale == "token_whiten" else None
    adv_PG, metrics = group_advantages(
        rewards_all.view(-1, G), baseline=a.baseline, scale=a.scale, std=a.std, eps=a.adv_eps, lengths_PG=lengths
    )  # REINFORCE++-baseline weighs by length
    return dist.local_rows(adv_PG).flatten(), metrics


def process_config_errors(c) -> list[str]:
    """``process_advantages`` reads the process reward's steps, group-std normalised: what it would drop."""
    a = c.algo
    if a.advantage != "process":
        return [
            f"reward.process_function={c.reward.process_function!r} is read only by algo.advantage=process "
            f"(got algo.advantage={a.advantage}); set algo.advantage=process or leave it empty"
        ] * bool(c.reward.process_function)
    checks = (
        (
            a.baseline == "group_mean" and a.scale == "group",
            "algo.advantage=process normalises step rewards by the group's mean and std; use "
            f"algo.baseline=group_mean and algo.scale=group (got {a.baseline}, {a.scale})",
        ),
        (
            a.kl_placement == "loss" or a.beta == 0,
            "algo.advantage=process scores steps with reward.process_function, so a KL in the outcome reward "
            "would be dropped; set algo.kl_placement=loss",
        ),
        (
            not c.reward.normalize_components,
            "algo.advantage=process scores steps with reward.process_function, so reward.normalize_components "
            "would be dropped; set it to false",
        ),
        (
            len(c.reward.functions) <= 1,
            "algo.advantage=process trains on reward.process_function's step rewards alone, so reward.functions "
            f"beyond the one logged as the reward would be dropped (got {c.reward.functions}); list one function",
        ),
        (
            all(w == 1.0 for w in c.reward.weights),
            "algo.advantage=process trains on reward.process_function's step rewards alone, so reward.weights "
            f"would be dropped (got {c.reward.weights}); leave reward.weights empty",
        ),
        (
            not a.dynamic_sampling,
            "algo.dynamic_sampling drops groups whose outcome rewards are all equal, but algo.advantage=process "
            "trains on step rewards that may differ within such a group (and be flat in a group it keeps); set "
            "algo.dynamic_sampling=false",
        ),
        (
            bool(c.reward.process_function),
            "algo.advantage=process needs reward.process_function (e.g. task, or module:function)",
        ),
    )
    return [message for ok, message in checks if not ok]


@register_advantage("process", StageSpec(config_errors=process_config_errors))
def process_estimator(ctx) -> tuple[torch.Tensor, dict[str, float]]:
    """DeepSeekMath process supervision: the process reward's (end token, reward) steps, padded into
    tensors, become per-token advantages ``(N, T)``."""
    sb, G = ctx.scored, ctx.group_size
    columns = repeat_columns(sb.prompts, G)
    prompts = [p.text for p in sb.prompts for _ in range(G)]
    raw = ctx.process_fn(prompts, sb.texts, completion_ids=sb.rollout.completion_ids, **columns)
    rewards, ends, mask = process_steps(raw)
    adv, metrics = process_advantages(
        rewards, ends, mask, G, ctx.mask_NT.shape[1], std=ctx.algo.std, eps=ctx.algo.adv_eps, token_mask_NT=ctx.mask_NT
    )
    return adv, _rank_part(ctx, metrics, {"advantages": ctx.mask_NT.sum()})  # over the trained tokens


def process_steps(steps: list[list[tuple[int, float]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The process reward's answer (one list of ``(end_token, reward)`` per completion, checked where the trainer
    builds the function: rewards/process_steps.py) as ``(rewards_NS, ends_NS, mask_NS)``, padded to the longest."""
    N, S = len(steps), max(1, max((len(s) for s in steps), default=0))
    rewards, ends, mask = torch.zeros(N, S), torch.zeros(N, S, dtype=torch.long), torch.zeros(N, S)
    for i, seq in enumerate(steps):
        for k, (end, value) in enumerate(seq):
            rewards[i, k], ends[i, k], mask[i, k] = float(value), int(end), 1.0
    return rewards, ends, mask


def _rank_part(ctx, metrics: dict[str, float], counts: dict[str, float | torch.Tensor]) -> dict[str, float]:
    """The metrics of an estimator that sees this rank's groups only, with the counts that make them the job's
    when the step's line is reduced over ranks (contexts.part_weights): the zero-std share over this rank's
    groups (their number summed), each statistic over the values it covers (``counts``, by key or prefix:
    ``advantages``, ``gigpo/step_advantages`` ...)."""
    groups = float(len(ctx.rewards_N) // ctx.group_size)
    return {**metrics, **part_weights({"frac_reward_zero_std": groups, "num_zero_std_groups": groups, **counts})}


def turn_ids(ro, width: int) -> torch.Tensor:
    """``(N, width)`` turn index of every completion token (0 for plain completions and padding)."""
    out = torch.zeros(ro.num_sequences, width, dtype=torch.long)
    for i, e in enumerate(ro.episodes or []):
        out[i, : len(e.turn_ids)] = torch.tensor(e.turn_ids, dtype=torch.long)
    return out


def _step_tensors(ctx):
    """Per-step tensors ``(N, S)`` of the episodes: the outcome reward on each episode's last turn,
    an integer id per state key (one key per prompt when the episode names none) and the step mask."""
    ro, G, rewards_N = ctx.scored.rollout, ctx.group_size, ctx.rewards_N
    eps = ro.episodes or [None] * ro.num_sequences
    turns = [e.turns if e is not None else 1 for e in eps]
    N, S = len(turns), max(turns)
    rewards, states, mask = torch.zeros(N, S), torch.zeros(N, S, dtype=torch.long), torch.zeros(N, S)
    ids: dict[str, int] = {}
    for i, (e, k) in enumerate(zip(eps, turns)):
        mask[i, :k] = 1.0
        rewards[i, k - 1] = float(rewards_N[i])  # outcome reward, on the episode's last step
        keys = e.state_keys if e is not None and e.state_keys else [f"p{i // G}"] * k
        for t, key in enumerate(keys[:k]):
            states[i, t] = ids.setdefault(key, len(ids))
    return rewards, states, mask


def credit_config_errors(c) -> list[str]:
    """GiGPO / GAGPO: the discounts are in [0, 1]; both normalise within groups (GAGPO by the group's std)."""
    a, out = c.algo, []
    if not (0 <= a.step_gamma <= 1 and 0 <= a.gae_lambda <= 1):
        out.append(f"algo.step_gamma={a.step_gamma} and algo.gae_lambda={a.gae_lambda} must be in [0, 1]")
    if a.advantage == "gagpo" and a.scale != "group":
        out.append(
            f"algo.advantage=gagpo always normalises its GAE by the group's std; use algo.scale=group (got {a.scale})"
        )
    if a.advantage in ("gigpo", "gagpo") and not (a.scale in ("group", "none") and a.baseline == "group_mean"):
        out.append(
            f"algo.advantage={a.advantage} normalises within groups: use algo.baseline=group_mean and algo.scale=group "
            f"or none (got {a.baseline}, {a.scale})"
        )
    return out


@dataclass(frozen=True)
class GiGPOParams:
    """GiGPO's own parameters (the config's fields of the same names)."""

    step_gamma: float = 0.95  # discount per turn of the episode's reward
    gigpo_step_weight: float = 1.0  # omega: weight of the step-level advantage


@dataclass(frozen=True)
class GAGPOParams:
    """GAGPO's own parameters (the config's fields of the same names)."""

    step_gamma: float = 0.95  # discount per turn of the episode's reward
    gae_lambda: float = 0.95  # lambda of the GAE-style sum of temporal differences


@register_advantage("gigpo", StageSpec(params=GiGPOParams, config_errors=credit_config_errors))
def gigpo_estimator(ctx) -> tuple[torch.Tensor, dict[str, float]]:
    """GiGPO: episode-level group advantage plus step-level advantage over equal states, per turn."""
    a, p = ctx.algo, ctx.params
    rewards, states, mask = _step_tensors(ctx)
    adv_NS, metrics = gigpo_advantages(
        ctx.rewards_N.view(-1, ctx.group_size).float(),
        rewards,
        states,
        mask,
        gamma=p.step_gamma,
        step_weight=p.gigpo_step_weight,
        scale="none" if a.scale == "none" else "group",
        std=a.std,
        eps=a.adv_eps,
    )
    steps = mask.sum()  # the real steps of this rank's episodes; "advantages" are the episodes' (A_E)
    step_keys = ("gigpo/step_advantages", "gigpo/step_group_size_mean", "gigpo/singleton_step_fraction")
    metrics = _rank_part(ctx, metrics, {"advantages": len(ctx.rewards_N), **dict.fromkeys(step_keys, steps)})
    return steps_to_tokens(adv_NS, turn_ids(ctx.scored.rollout, ctx.mask_NT.shape[1]), ctx.mask_NT.cpu()), metrics


@register_advantage("gagpo", StageSpec(params=GAGPOParams, config_errors=credit_config_errors))
def gagpo_estimator(ctx) -> tuple[torch.Tensor, dict[str, float]]:
    """GAGPO: group-anchored GAE over the turns of each episode, per turn."""
    a, p = ctx.algo, ctx.params
    rewards, states, mask = _step_tensors(ctx)
    adv_NS, metrics = gagpo_advantages(
        rewards, states, mask, ctx.group_size, gamma=p.step_gamma, lam=p.gae_lambda, std=a.std, eps=a.adv_eps
    )
    metrics = _rank_part(ctx, metrics, dict.fromkeys(("advantages", "gagpo/value_proxy"), mask.sum()))
    return steps_to_tokens(adv_NS, turn_ids(ctx.scored.rollout, ctx.mask_NT.shape[1]), ctx.mask_NT.cpu()), metrics


def shaping_config_errors(c) -> list[str]:
    """GTPO / GRPO-S: the weights are >= 0, the normalisation one GTPO knows; GTPO normalises its token
    rewards itself, so another baseline or scale would be ignored."""
    a, out = c.algo, []
    if a.gtpo_normalization not in GTPO_NORMALIZATIONS:
        out.append(
            f"algo.gtpo_normalization={a.gtpo_normalization!r} is not valid; choose one of: "
            f"{', '.join(GTPO_NORMALIZATIONS)}"
        )
    if not (a.shaping_base_weight >= 0 and a.shaping_entropy_weight >= 0):
        out.append(
            f"algo.shaping_base_weight={a.shaping_base_weight} and algo.shaping_entropy_weight="
            f"{a.shaping_entropy_weight} must be >= 0 (the paper uses 1.0 and 0.1)"
        )
    if a.advantage == "gtpo" and not (a.baseline == "group_mean" and a.scale == "group"):
        out.append(
            "algo.advantage=gtpo normalises its token rewards itself (algo.gtpo_normalization); use "
            f"algo.baseline=group_mean and algo.scale=group (got {a.baseline}, {a.scale})"
        )
    return out


@dataclass(frozen=True)
class ShapingParams:
    """GRPO-S's own parameters, and GTPO's but its normalisation (the config's fields of the same names)."""

    shaping_base_weight: float = 1.0  # alpha1 / beta1: weight of the outcome reward
    shaping_entropy_weight: float = 0.1  # alpha2 / beta2: weight of the entropy-shaped bonus or penalty


@dataclass(frozen=True)
class GTPOParams(ShapingParams):
    """GTPO's own parameters: the shaping weights and how its token rewards are normalised."""

    gtpo_normalization: str = "polarity"  # "polarity" (eq. 6) or "joint"


@register_advantage("gtpo", StageSpec(needs_entropy=True, params=GTPOParams, config_errors=shaping_config_errors))
def gtpo_estimator(ctx) -> tuple[torch.Tensor, dict[str, float]]:
    """GTPO (arXiv 2508.04349): per-token rewards shaped by pi_old's entropies, ``(N, T)``; the token
    statistics run over every rank's tokens."""
    a, p, dist = ctx.algo, ctx.params, ctx.dist
    ent, mask = ctx.entropy_NT.float().cpu(), ctx.mask_NT.float().cpu()
    r_PG = ctx.rewards_N.float().view(-1, ctx.group_size)
    b1, b2 = p.shaping_base_weight, p.shaping_entropy_weight
    shaped, pos_N, valid = gtpo_token_rewards(r_PG, ent, mask, alpha1=b1, alpha2=b2)
    pools = (  # GTPO eq. 6 over the whole batch: every rank's O+ and O- token rewards (one process: its own)
        (dist.gather_varlen(shaped[valid & pos_N[:, None]]), dist.gather_varlen(shaped[valid & ~pos_N[:, None]]))
        if dist.active
        else None
    )
    adv, metrics = gtpo_advantages(
        r_PG, ent, mask, alpha1=b1, alpha2=b2, normalization=p.gtpo_normalization, std=a.std, eps=a.adv_eps, pools=pools
    )
    return adv, _rank_part(ctx, metrics, dict.fromkeys(("advantages", "gtpo/shaped_reward"), valid.sum()))


@register_advantage("grpo_s", StageSpec(needs_entropy=True, params=ShapingParams))
def grpo_s_estimator(ctx) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO-S: per-completion rewards shaped by the mean token entropy, then ``baseline`` / ``scale``."""
    a, p, dist, G = ctx.algo, ctx.params, ctx.dist, ctx.group_size
    ent, mask = ctx.entropy_NT.float().cpu(), ctx.mask_NT.float().cpu()
    r_PG = ctx.rewards_N.float().view(-1, G)
    seq_ent = (ent * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # GRPO-S eq. 8: mean token entropy
    lengths = dist.gather_rows(mask.sum(dim=1)).view(-1, G) if a.scale == "token_whiten" else None
    adv_PG, metrics = grpo_s_advantages(
        dist.gather_rows(r_PG),
        dist.gather_rows(seq_ent).view(-1, G),
        beta1=p.shaping_base_weight,
        beta2=p.shaping_entropy_weight,
        baseline=a.baseline,
        scale=a.scale,
        std=a.std,
        eps=a.adv_eps,
        lengths_PG=lengths,
    )
    return dist.local_rows(adv_PG).flatten(), metrics


@register_token_mask("overlong", StageSpec(active=lambda s: s.algo.mask_truncated))
def overlong_mask(ctx) -> torch.Tensor:
    """DAPO overlong filtering (``algo.mask_truncated``): truncated completions leave the loss, by their finish
    reasons or, with ``algo.truncated_by=last_token``, by their last token (TRL's rule)."""
    return overlong_filter(ctx.mask_NT, ctx.finish_reasons, ctx.algo.truncated_by, ctx.ended)


def entropy_top_config_errors(c) -> list[str]:
    f = c.algo.entropy_top_fraction
    return [] if 0 < f <= 1 else [f"algo.entropy_top_fraction={f} must be in (0, 1]"]


@register_token_mask(
    "entropy_top",
    StageSpec(
        needs_entropy=True,
        active=lambda s: s.algo.entropy_top_fraction < 1,
        config_errors=entropy_top_config_errors,
        policy_only=True,
    ),
)
def entropy_top_mask(ctx) -> torch.Tensor:
    """ "Beyond the 80/20 rule" (``algo.entropy_top_fraction``): only the highest-entropy tokens carry the
    policy gradient, the quantile taken over every rank's tokens. A policy-only mask: every completion token
    keeps its KL term and its place in the normalisers (the paper masks the policy term; TRL likewise)."""
    pool = ctx.dist.gather_varlen(ctx.entropy_NT[ctx.mask_NT.bool()]) if ctx.dist.active else None  # global quantile
    return entropy_token_mask(ctx.entropy_NT, ctx.mask_NT, ctx.algo.entropy_top_fraction, pool=pool)
