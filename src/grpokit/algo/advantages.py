"""Stage 4: group-relative advantages, the part of GRPO that replaces PPO's value network.

Every function here is pure: tensors in, ``(tensor, metrics)`` out. Rewards arrive shaped
``(P, G)``: P prompts, each with a group of G completions. The GRPO family differs only in two
choices, which are named modes of ``group_advantages``:

* the *baseline* subtracted from each reward: the group mean (GRPO, DeepSeekMath 2024) or the mean
  of the other G-1 rewards (RLOO, Ahmadian et al. 2024);
* the *scale* the centred reward is divided by: the group's std (GRPO), the batch's std (TRL's
  ``scale_rewards="batch"``), nothing (Dr. GRPO, Liu et al. 2025), or a whitening of the centred
  rewards over the whole batch (REINFORCE++-baseline, Hu et al. 2025): over the batch's tokens, each
  completion weighted by its length, as verl computes it (``token_whiten``), or over its completions,
  each weighing one (``batch_whiten``).

Flat groups. A group whose rewards are all equal carries no signal: its advantages are exactly zero.
Rewards that differ only by floating-point noise (e.g. 0.1 + 0.2 vs 0.3) must not be divided by a
std of 1e-17 and explode, so a group counts as flat when its spread is within
``max(flat_rtol * max|r|, FLAT_ATOL)`` of zero: relative to the rewards' own scale, so a reward
scaled small (``1e-4 * {0, 1}``) keeps its signal. The default ``flat_rtol = 1e-6`` is about eight
float32 ulps at the reward's scale: far above summation noise, far below any reward difference
anyone means. ``FLAT_ATOL = 1e-8`` is TRL's zero-std test (``torch.isclose(std, 0)``: atol 1e-8),
the floor for rewards at or near zero.
Flat groups are zeroed in every mode and counted in the ``frac_reward_zero_std`` metric.

Unscorable completions. A completion every reward function returned None for has no reward; its
reward is NaN here (algo/pipeline.py marks it), no statistic counts it and its advantage is 0, as in
TRL 1.16: counted as a reward of 0 it would move its group's baseline and std and receive an
advantage for a score it never got.

Process supervision (DeepSeekMath §4.1.3) gives per-token advantages instead; see
``process_advantages``.
"""

from __future__ import annotations

from typing import Literal

import torch

from .loss import kl_estimate

Baseline = Literal["group_mean", "leave_one_out"]
Scale = Literal["group", "batch", "none", "batch_whiten", "token_whiten"]
StdKind = Literal["unbiased", "population"]

FLAT_ATOL = 1e-8  # TRL's zero-std test: torch.isclose(std, 0), whose atol is 1e-8
BASELINES: tuple[str, ...] = ("group_mean", "leave_one_out")
SCALES: tuple[str, ...] = ("group", "batch", "none", "batch_whiten", "token_whiten")
STD_KINDS: tuple[str, ...] = ("unbiased", "population")

# Named estimators: each is a (baseline, scale) pair of the same function.
ESTIMATORS: dict[str, tuple[str, str]] = {
    "grpo": ("group_mean", "group"),  # DeepSeekMath: (r - mean) / std
    "dr_grpo": ("group_mean", "none"),  # Dr. GRPO: drop the std, keep the mean
    "rloo": ("leave_one_out", "none"),  # RLOO: r_i - mean of the other G-1
    "reinforce_pp_baseline": ("group_mean", "token_whiten"),  # REINFORCE++-baseline, as verl computes it
}


def _std(x: torch.Tensor, dim: int | None, kind: str, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Standard deviation with Bessel's correction ("unbiased") or without ("population"); with ``valid``
    (a 0/1 float mask shaped like ``x``) over those entries only (fewer than the correction needs: 0)."""
    correction = 1 if kind == "unbiased" else 0
    if valid is None:
        return x.std(correction=correction) if dim is None else x.std(dim=dim, keepdim=True, correction=correction)
    n = valid.sum() if dim is None else valid.sum(dim=dim, keepdim=True)
    dev2 = ((x - _mean(x, dim, valid)) * valid) ** 2
    total = dev2.sum() if dim is None else dev2.sum(dim=dim, keepdim=True)
    return (total / (n - correction).clamp(min=1)).sqrt()


def _mean(x: torch.Tensor, dim: int | None, valid: torch.Tensor) -> torch.Tensor:
    """Mean of the ``valid`` entries of ``x`` (over ``dim``, kept as size 1; over all for None); 0 without any."""
    if dim is None:
        return (x * valid).sum() / valid.sum().clamp(min=1)
    return (x * valid).sum(dim=dim, keepdim=True) / valid.sum(dim=dim, keepdim=True).clamp(min=1)


def flat_groups(
    rewards_PG: torch.Tensor, flat_rtol: float = 1e-6, valid: torch.Tensor | None = None, keepdim: bool = False
) -> torch.Tensor:
    """Boolean ``(P,)``: True where a group's rewards (dim 1) are all equal up to floating-point noise.

    A group is flat when ``max - min <= max(flat_rtol * max|r|, FLAT_ATOL)`` (see the module docstring).
    With ``valid``, only those entries count (padding and not-applicable rewards are not rewards of
    0); NaN entries (unscorable completions) never count; a group without valid entries is flat.
    ``keepdim`` keeps dim 1 as size 1.
    """
    nan = torch.isnan(rewards_PG)
    if bool(nan.any()):
        valid = ~nan if valid is None else valid & ~nan
        rewards_PG = torch.nan_to_num(rewards_PG, nan=0.0)
    if valid is None:
        hi, lo = rewards_PG.amax(dim=1, keepdim=keepdim), rewards_PG.amin(dim=1, keepdim=keepdim)
    else:
        big = torch.finfo(rewards_PG.dtype).max
        hi = torch.where(valid, rewards_PG, torch.full_like(rewards_PG, -big)).amax(dim=1, keepdim=keepdim)
        lo = torch.where(valid, rewards_PG, torch.full_like(rewards_PG, big)).amin(dim=1, keepdim=keepdim)
    return (hi - lo) <= (flat_rtol * torch.maximum(hi.abs(), lo.abs())).clamp(min=FLAT_ATOL)  # relative, TRL's floor


def group_advantages(
    rewards_PG: torch.Tensor,
    *,
    baseline: Baseline = "group_mean",
    scale: Scale = "group",
    std: StdKind = "unbiased",
    eps: float = 1e-4,
    flat_rtol: float = 1e-6,
    lengths_PG: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-completion advantages from a group's rewards.

    Args:
        rewards_PG: ``(P, G)`` scalar reward of completion g of prompt p; NaN for an unscorable
            completion (every reward function returned None): it is left out of every mean and std
            (and of ``token_whiten``'s weights) and gets advantage 0, as TRL does; a group with fewer
            than two scored completions is flat.
        baseline: ``"group_mean"`` subtracts ``mean_g r`` (GRPO); ``"leave_one_out"`` subtracts
            ``(sum_j r_j - r_i) / (G - 1)`` (RLOO), which equals ``G/(G-1) * (r_i - mean)`` (G: the
            group's scored completions).
        scale: divide the centred rewards ``c`` by ``std_group(r) + eps`` (``"group"``, GRPO),
            by ``std_batch(r) + eps`` over all P*G rewards (``"batch"``), not at all (``"none"``,
            Dr. GRPO), or whiten them over the batch (REINFORCE++-baseline): over the batch's
            tokens, ``(c - mu) / sqrt(var + eps)`` with ``mu`` and ``var`` weighted by the
            completion lengths ``L`` (``"token_whiten"``, verl's ``reinforce_plus_plus_baseline``;
            see ``token_whiten``), or over its completions, ``(c - mean(c)) / (std(c) + eps)``, every
            completion weighing one (``"batch_whiten"``).
        std: ``"unbiased"`` (Bessel, divides by G-1, or by sum(L)-1 for ``token_whiten``; TRL and
            verl) or ``"population"`` (divides by G; the textbook worked examples).
        eps: added to the std in the denominator (to the variance, inside the square root, for
            ``token_whiten``, where verl puts it).
        flat_rtol: tolerance that decides a group is flat (all rewards equal); flat groups get
            exactly zero advantage.
        lengths_PG: ``(P, G)`` completion lengths in tokens; needed by ``token_whiten`` only.

    Returns:
        ``(advantages_PG, metrics)`` with metrics ``frac_reward_zero_std``, ``num_zero_std_groups``
        and ``advantages/{mean,std,min,max}``.
    """
    if rewards_PG.dim() != 2:
        raise ValueError(f"rewards_PG must be 2-D (P prompts, G completions), got shape {tuple(rewards_PG.shape)}")
    P, G = rewards_PG.shape
    if G < 2:
        raise ValueError(f"group-relative advantages need at least 2 completions per prompt, got G={G}")
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; valid: {', '.join(BASELINES)}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    if std not in STD_KINDS:
        raise ValueError(f"unknown std kind {std!r}; valid: {', '.join(STD_KINDS)}")
    valid = ~torch.isnan(rewards_PG)  # an unscorable completion (no reward function scored it): NaN, as TRL
    v, r = valid.to(torch.float32), torch.nan_to_num(rewards_PG.to(torch.float32), nan=0.0)
    flat_P = flat_groups(r, flat_rtol, valid)  # also a group with fewer than two scored completions
    centred_PG = BASELINE_FNS[baseline](r, v)
    lengths = _lengths(lengths_PG, rewards_PG.shape) * v if scale == "token_whiten" else None
    centred_PG = torch.where(flat_P[:, None] | ~valid, torch.zeros_like(centred_PG), centred_PG)
    adv_PG = SCALE_FNS[scale](centred_PG, r, v, std, eps, lengths)
    adv_PG = torch.where(flat_P[:, None] | ~valid, torch.zeros_like(adv_PG), adv_PG)
    n_flat = int(flat_P.sum())
    metrics = {
        "frac_reward_zero_std": n_flat / P,
        "num_zero_std_groups": float(n_flat),
        **_stats("advantages", adv_PG[valid]),
    }
    return adv_PG, metrics


def _loo(r: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """RLOO: ``r_i - (sum_j r_j - r_i)/(n-1)`` over the n scored completions, ``= n/(n-1) (r_i - mean(r))``."""
    n = v.sum(dim=1, keepdim=True)
    return (r - _mean(r, 1, v)) * (n / (n - 1).clamp(min=1))


# The baselines and scales of ``group_advantages`` by config name (algo.baseline, algo.scale); ``v`` is the
# 0/1 mask of the scored completions, the only ones every mean and std counts.
BASELINE_FNS = {  # (rewards_PG, v) -> centred_PG
    "group_mean": lambda r, v: r - _mean(r, 1, v),  # GRPO: r_i - mean(r)
    "leave_one_out": _loo,  # RLOO: r_i - mean of the other rewards
}
SCALE_FNS = {  # (centred_PG, rewards_PG, v, std kind, eps, lengths_PG) -> advantages_PG
    "group": lambda c, r, v, std, eps, L: c / (_std(r, 1, std, v) + eps),  # DeepSeekMath: (r - mean) / std
    "batch": lambda c, r, v, std, eps, L: c / (_std(r, None, std, v) + eps),  # TRL's scale_rewards="batch"
    "none": lambda c, r, v, std, eps, L: c,  # Dr. GRPO: mean-centred only, no std
    # group mean removed, then whitened over the batch's completions (each weighs one)
    "batch_whiten": lambda c, r, v, std, eps, L: (c - _mean(c, None, v)) / (_std(c, None, std, v) + eps),
    # REINFORCE++-baseline as verl: flat groups enter the statistics with c = 0 and are zeroed after
    # (verl leaves them at -mu / sqrt(var + eps), a pure length effect); an unscorable row weighs 0
    "token_whiten": lambda c, r, v, std, eps, L: token_whiten(c, L, std=std, eps=eps),
}


def token_whiten(
    centred_PG: torch.Tensor, lengths_PG: torch.Tensor, *, std: StdKind = "unbiased", eps: float = 1e-8
) -> torch.Tensor:
    """REINFORCE++-baseline's batch whitening as verl computes it (``masked_whiten`` over the
    response mask): every token of completion i carries ``c_i``, and the batch's tokens are whitened.

    With ``L_i`` the length of completion i and ``n = sum_i L_i``:
    ``mu = sum_i L_i c_i / n``, ``var = sum_i L_i (c_i - mu)^2 / (n - 1)`` (``"unbiased"``; ``/ n``
    for ``"population"``; the divisor is clamped at 1), and ``A_i = (c_i - mu) / sqrt(var + eps)``.
    Long completions weigh more in both statistics, so with varied lengths ``mu`` is not 0 and a
    completion's advantage depends on the other completions' lengths. Returns ``(P, G)``.

    The paper (Hu et al., 2025) writes the same thing: ``A_{q,o_t} = r - mean_group(r)``, then
    ``(A - mean(A)) / std(A)`` over every ``A_{q,o_t}`` of the batch, one per token.
    """
    w = lengths_PG.to(centred_PG.dtype)
    n = w.sum()
    mu = (w * centred_PG).sum() / n.clamp(min=1)
    var = (w * (centred_PG - mu) ** 2).sum() / (n - (1 if std == "unbiased" else 0)).clamp(min=1)
    return (centred_PG - mu) / torch.sqrt(var + eps)  # verl: rsqrt(var + eps), eps inside the root


def _lengths(lengths_PG: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    if lengths_PG is None:
        raise ValueError(
            "scale 'token_whiten' weights completions by their length; pass lengths_PG (P, G) token counts"
        )
    if tuple(lengths_PG.shape) != tuple(shape) or bool((lengths_PG < 0).any()):
        raise ValueError(
            f"lengths_PG must be non-negative token counts shaped like the rewards {tuple(shape)}, got shape "
            f"{tuple(lengths_PG.shape)}"
        )
    return lengths_PG


def process_advantages(
    step_rewards_NS: torch.Tensor,
    step_ends_NS: torch.Tensor,
    step_mask_NS: torch.Tensor,
    group_size: int,
    num_tokens: int,
    *,
    std: StdKind = "unbiased",
    eps: float = 1e-4,
    flat_rtol: float = 1e-6,
    token_mask_NT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token advantages from step rewards (DeepSeekMath, GRPO with process supervision).

    Completion i has steps s = 1..S_i; step s ends at token index ``step_ends_NS[i, s]`` and has
    reward ``step_rewards_NS[i, s]``. All valid step rewards of a group (every step of every one
    of its G completions) are normalised together: ``r~ = (r - mean_group) / (std_group + eps)``.
    The advantage of token t of completion i is the sum of the normalised rewards of the steps
    that end at or after t: ``A[i, t] = sum_{s : end(s) >= t} r~[i, s]``.

    Args:
        step_rewards_NS: ``(N, S)`` step rewards, N = P*G completions grouped consecutively,
            padded to S steps.
        step_ends_NS: ``(N, S)`` integer token index (0-based, inclusive) where each step ends.
        step_mask_NS: ``(N, S)`` 1 for a real step, 0 for padding.
        group_size: G.
        num_tokens: T, the width of the returned per-token advantages.
        token_mask_NT: ``(N, T)`` the tokens that train (None: all T of every completion); the
            ``advantages/*`` statistics are over them.

    Returns:
        ``(advantages_NT, metrics)``. A group whose valid step rewards are all equal gets zeros. The
        statistics are those of the per-token advantages the loss reads (a token's is a sum of step
        rewards), not of the normalised step rewards.
    """
    N, S = step_rewards_NS.shape
    if N % group_size:
        raise ValueError(f"{N} completions do not split into groups of {group_size}")
    P = N // group_size
    valid_PX = step_mask_NS.reshape(P, group_size * S).bool()
    r_PX = step_rewards_NS.reshape(P, group_size * S).to(torch.float32)

    dev_PX, std_P1, flat_P1 = _masked_group_stats(r_PX, valid_PX, std, flat_rtol)
    flat_P = flat_P1[:, 0]  # also true for a group without any step

    norm_PX = torch.where(flat_P[:, None], torch.zeros_like(dev_PX), dev_PX / (std_P1 + eps))
    norm_NS = norm_PX.reshape(N, S) * step_mask_NS

    t_T = torch.arange(num_tokens, device=step_rewards_NS.device)
    # covers[i, s, t] = 1 when step s of completion i ends at or after token t
    covers_NST = (step_ends_NS[:, :, None] >= t_T[None, None, :]).to(norm_NS.dtype)
    adv_NT = (covers_NST * norm_NS[:, :, None]).sum(dim=1)

    n_flat = int(flat_P.sum())
    metrics = {
        "frac_reward_zero_std": n_flat / P,
        "num_zero_std_groups": float(n_flat),
        **_stats("advantages", adv_NT if token_mask_NT is None else adv_NT[token_mask_NT.bool()]),
    }
    return adv_NT, metrics


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.detach().float().flatten()
    if x.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/std": 0.0, f"{prefix}/min": 0.0, f"{prefix}/max": 0.0}
    return {
        f"{prefix}/mean": x.mean().item(),
        f"{prefix}/std": x.std(correction=0).item(),
        f"{prefix}/min": x.min().item(),
        f"{prefix}/max": x.max().item(),
    }


def normalize_components(
    rewards_PGF: torch.Tensor,
    weights_F: torch.Tensor,
    *,
    std: StdKind = "unbiased",
    eps: float = 1e-4,
    flat_rtol: float = 1e-6,
) -> torch.Tensor:
    """Multi-objective GRPO (MO-GRPO style): normalise each reward component within its group,
    then take the weighted sum, ``r_pg = sum_f w_f (r_pgf - mean_g r_pgf) / (std_g r_pgf + eps)``.

    Without it the component with the largest variance dominates the advantage whatever its weight.
    NaN entries (a function that does not apply to a completion) are left out of the statistics and
    contribute 0; a flat component contributes 0 to its group. Returns ``(P, G)``.
    """
    P, G, F = rewards_PGF.shape
    valid = ~torch.isnan(rewards_PGF)
    r = torch.nan_to_num(rewards_PGF.float(), nan=0.0)
    dev, sd, flat = _masked_group_stats(r, valid, std, flat_rtol)  # statistics over the group (dim 1)
    z = torch.where(flat, torch.zeros_like(dev), dev / (sd + eps))
    return (z * weights_F.view(1, 1, F).to(z.dtype)).sum(dim=2)


def kl_penalized_rewards(
    rewards_N: torch.Tensor,
    logp_NT: torch.Tensor,
    ref_logp_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    beta: float,
    estimator: str = "k1",
    clamp: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL in the reward (PPO / REINFORCE++ style) instead of in the loss:
    ``r_i <- r_i - beta * sum_t KL_k[i, t]``, the per-token estimate ``estimator`` (k1: ``logp -
    ref_logp``; see ``loss.kl_estimate``, also for ``clamp``) summed over the completion, as verl's
    ``apply_kl_penalty`` followed by an outcome advantage estimator does.
    Returns ``(penalised rewards (N,), per-sequence KL (N,))``.
    """
    kl_N = (kl_estimate(logp_NT, ref_logp_NT, estimator, clamp=clamp) * mask_NT).sum(dim=1)
    return rewards_N - beta * kl_N, kl_N


def response_entropy(entropy_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """``P_i``: the mean policy entropy over completion i's masked tokens, ``(N,)``."""
    mask = mask_NT.to(entropy_NT.dtype)
    return (entropy_NT * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def entropy_scaled_advantages(
    adv: torch.Tensor, entropy_N: torch.Tensor, mean_entropy: torch.Tensor | float, max_scale: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """EDGE-GRPO's entropy-driven advantage (Zhang et al., arXiv 2507.21848, EDA):
    ``A_i <- A_i / P^_i`` with ``P^_i = P_i / mean_j P_j`` (``P_i`` from ``response_entropy``; the
    mean over the batch, as the authors' code takes it). Correctness-aware through the sign of A: a
    confident (low-entropy) correct answer gains, a confident wrong one is pushed down harder, an
    uncertain one of either kind moves less. ``adv``: ``(N,)`` or per token ``(N, T)``.
    ``max_scale``: cap on ``mean / P_i`` (None: none; a completion of near-zero entropy otherwise
    gets an unbounded advantage); the floor of 1e-8 on ``P_i`` only avoids a division by zero.
    """
    scale_N = float(mean_entropy) / entropy_N.clamp(min=1e-8)  # EDGE-GRPO EDA: 1 / P^_i
    if max_scale is not None:
        scale_N = scale_N.clamp(max=max_scale)
    scale = scale_N if adv.dim() == 1 else scale_N[:, None]
    return adv * scale.to(adv.device, adv.dtype), _stats("eda/scale", scale_N)


def _masked_group_stats(r: torch.Tensor, valid: torch.Tensor, std: str, flat_rtol: float):
    """Deviations from the mean, std and flatness over dim 1, counting only ``valid`` entries
    (padding and not-applicable rewards must not count as rewards of 0). Shapes keep dim 1 as 1."""
    n = valid.sum(dim=1, keepdim=True).clamp(min=1)
    mean = (r * valid).sum(dim=1, keepdim=True) / n
    dev = (r - mean) * valid
    denom = (n - (1 if std == "unbiased" else 0)).clamp(min=1)
    sd = ((dev**2).sum(dim=1, keepdim=True) / denom).sqrt()
    return dev, sd, flat_groups(r, flat_rtol, valid, keepdim=True)
