"""Stage 4 for multi-turn episodes: step-level credit (GiGPO, GAGPO) instead of one advantage per
completion.

An episode of K model turns is K steps. Step tensors are ``(N, S)``: N = P*G episodes grouped by
prompt, padded to S steps; ``step_mask_NS`` is 1 on real steps. ``state_ids_NS`` names the state
each step acted from: equal ids within one prompt's group are identical states (ids of different
groups never meet). ``steps_to_tokens`` spreads step advantages over each turn's tokens. Pure
functions, as in advantages.py, whose group statistics they reuse.
"""

from __future__ import annotations

import torch

from .advantages import Scale, StdKind, _masked_group_stats, _stats, group_advantages

CREDITS: tuple[str, ...] = ("outcome", "gigpo", "gagpo")


def discounted_returns(step_rewards_NS: torch.Tensor, step_mask_NS: torch.Tensor, gamma: float) -> torch.Tensor:
    """``R[i, t] = r[i, t] + gamma * R[i, t+1]`` over the real steps of each episode (0 after the last)."""
    r = step_rewards_NS.float() * step_mask_NS
    out = torch.zeros_like(r)
    nxt = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        nxt = (r[:, t] + gamma * nxt) * step_mask_NS[:, t]
        out[:, t] = nxt
    return out


def scored_steps(
    step_rewards_NS: torch.Tensor, step_mask_NS: torch.Tensor, episode_rewards_N: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(step rewards, step mask)`` without the unscorable episodes: a row whose episode reward or any
    real step reward is NaN (no reward function scored it) loses its steps, and its NaNs become 0."""
    nan_NS = torch.isnan(step_rewards_NS) & (step_mask_NS > 0)
    unscored_N = nan_NS.any(dim=1) if episode_rewards_N is None else nan_NS.any(dim=1) | torch.isnan(episode_rewards_N)
    mask = step_mask_NS * (~unscored_N)[:, None].to(step_mask_NS.dtype)
    return torch.nan_to_num(step_rewards_NS, nan=0.0), mask


def _state_group_stats(
    values_NS: torch.Tensor,
    state_ids_NS: torch.Tensor,
    step_mask_NS: torch.Tensor,
    group_size: int,
    std: str,
    flat_rtol: float,
):
    """Per step: mean, std and size of the values of all real steps of its prompt's group that act
    from the same state, and whether those values are all equal. Shapes ``(N, S)``."""
    N, S = values_NS.shape
    valid = step_mask_NS.bool()
    prompt_NS = (torch.arange(N, device=values_NS.device) // group_size)[:, None].expand(N, S)
    key = torch.stack([prompt_NS[valid], state_ids_NS[valid].long()], dim=1)
    _, inv = torch.unique(key, dim=0, return_inverse=True)  # one id per (prompt, state)
    K = int(inv.max().item()) + 1 if inv.numel() else 0
    v = values_NS[valid].float()
    count = torch.zeros(K).index_add_(0, inv, torch.ones_like(v))
    mean = torch.zeros(K).index_add_(0, inv, v) / count.clamp(min=1)
    dev = v - mean[inv]
    denom = (count - (1 if std == "unbiased" else 0)).clamp(min=1)
    sd = (torch.zeros(K).index_add_(0, inv, dev * dev) / denom).sqrt()
    big = torch.finfo(v.dtype).max
    hi = torch.full((K,), -big).scatter_reduce(0, inv, v, "amax")
    lo = torch.full((K,), big).scatter_reduce(0, inv, v, "amin")
    flat = (hi - lo) <= flat_rtol * torch.maximum(hi.abs(), lo.abs()).clamp(min=1.0)

    def place(x):
        out = torch.zeros(N, S, dtype=x.dtype)
        out[valid] = x[inv]
        return out

    return place(mean), place(sd), place(count), place(flat)


def gigpo_advantages(
    episode_rewards_PG: torch.Tensor,
    step_rewards_NS: torch.Tensor,
    state_ids_NS: torch.Tensor,
    step_mask_NS: torch.Tensor,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    scale: Scale = "group",
    std: StdKind = "unbiased",
    eps: float = 1e-4,
    flat_rtol: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GiGPO (Feng et al. 2025, arXiv 2505.10978): episode-level plus step-level relative advantages.

    Episode level: the GRPO advantage of each episode's reward within its group, ``A_E`` (eq. for
    the macro advantage; ``scale="none"`` is the paper's variant without the std). Step level
    ("anchor state grouping"): the steps of a group that act from the same state form a step group;
    each step's discounted return ``R_t = sum_k gamma^k r_{t+k}`` is compared within it,
    ``A_S = (R_t - mean) / (std + eps)``; a step alone in its state group, or in a flat one, gets
    ``A_S = 0``. Every step's advantage is ``A_E + step_weight * A_S`` (GiGPO: omega = 1).

    An unscorable episode (NaN reward: no reward function scored it) takes part in no statistic, of
    its group or of its states, and gets 0 on every step.

    Returns ``(advantages_NS, metrics)``; padding steps are 0.
    """
    P, G = episode_rewards_PG.shape
    adv_E_PG, metrics = group_advantages(episode_rewards_PG, scale=scale, std=std, eps=eps, flat_rtol=flat_rtol)
    step_rewards_NS, step_mask_NS = scored_steps(step_rewards_NS, step_mask_NS, episode_rewards_PG.reshape(-1))
    R = discounted_returns(step_rewards_NS, step_mask_NS, gamma)
    mean, sd, count, flat = _state_group_stats(R, state_ids_NS, step_mask_NS, G, std, flat_rtol)
    centred = R - mean
    adv_S = centred / (sd + eps) if scale != "none" else centred  # GiGPO: step-level relative advantage
    adv_S = torch.where(flat.bool() | (count < 2), torch.zeros_like(adv_S), adv_S)
    adv = (adv_E_PG.reshape(-1)[:, None] + step_weight * adv_S) * step_mask_NS  # GiGPO: A = A_E + omega * A_S
    real = step_mask_NS.bool()
    metrics.update(
        {
            "gigpo/step_group_size_mean": count[real].mean().item() if real.any() else 0.0,
            "gigpo/singleton_step_fraction": (count[real] < 2).float().mean().item() if real.any() else 0.0,
            **_stats("gigpo/step_advantages", adv_S[real]),
        }
    )
    return adv, metrics


def gagpo_advantages(
    step_rewards_NS: torch.Tensor,
    state_ids_NS: torch.Tensor,
    step_mask_NS: torch.Tensor,
    group_size: int,
    *,
    gamma: float = 0.95,
    lam: float = 0.95,
    std: StdKind = "unbiased",
    eps: float = 1e-4,
    flat_rtol: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GAGPO (Zhu et al. 2026, arXiv 2605.13217): GAE over a grouped value proxy, group-normalised.

    Grouped value proxy: ``V(s)`` is the mean discounted return of the group's steps acting from
    state ``s`` (no critic). Temporal differences ``d_t = r_t + gamma V(s_{t+1}) - V(s_t)`` (V = 0
    after the last step) are summed GAE-style, ``A_t = d_t + gamma * lam * A_{t+1}``; then every
    step advantage of a group is normalised with the group's mean and std over its real steps.
    With ``lam = 1`` the sum telescopes to ``R_t - V(s_t)``. The paper pairs this with an action-level
    importance ratio (``algo.ratio_level=turn``, loss.py).

    An episode with a NaN step reward (unscorable: no reward function scored it) takes part in no
    statistic and gets 0 on every step.

    Returns ``(advantages_NS, metrics)``; padding steps are 0.
    """
    N, S = step_rewards_NS.shape
    if N % group_size:
        raise ValueError(f"{N} episodes do not split into groups of {group_size}")
    step_rewards_NS, step_mask_NS = scored_steps(step_rewards_NS, step_mask_NS)
    m = step_mask_NS.float()
    r = step_rewards_NS.float() * m
    R = discounted_returns(r, m, gamma)
    V, _, _, _ = _state_group_stats(R, state_ids_NS, m, group_size, std, flat_rtol)  # GAGPO: grouped value proxy
    V_next = torch.cat([V[:, 1:] * m[:, 1:], torch.zeros_like(V[:, :1])], dim=1)
    delta = (r + gamma * V_next - V) * m  # GAGPO: TD residual on the proxy
    A = torch.zeros_like(delta)
    acc = torch.zeros_like(delta[:, 0])
    for t in range(S - 1, -1, -1):
        acc = (delta[:, t] + gamma * lam * acc) * m[:, t]  # GAGPO: GAE-style backward sum
        A[:, t] = acc
    P = N // group_size
    dev, sd, flat = _masked_group_stats(A.reshape(P, -1), m.reshape(P, -1).bool(), std, flat_rtol)
    adv = torch.where(flat, torch.zeros_like(dev), dev / (sd + eps)).reshape(N, S) * m  # GAGPO: group normalisation
    n_flat = int(flat.sum())
    metrics = {
        "frac_reward_zero_std": n_flat / P,
        "num_zero_std_groups": float(n_flat),
        **_stats("advantages", adv[m.bool()]),
        **_stats("gagpo/value_proxy", V[m.bool()]),
    }
    return adv, metrics


def steps_to_tokens(adv_NS: torch.Tensor, turn_ids_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """Per-token advantages ``(N, T)``: token t gets the advantage of the turn it belongs to
    (``turn_ids_NT``), masked by ``mask_NT`` (environment tokens and padding get 0)."""
    return adv_NS.gather(1, turn_ids_NT.clamp(min=0, max=adv_NS.shape[1] - 1).long()) * mask_NT
