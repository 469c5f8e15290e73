"""Stage 4, entropy-shaped rewards: GTPO and GRPO-S (Tan et al., arXiv 2508.04349).

Both redistribute a group's outcome reward with the policy's entropy before the advantages:

* GTPO (token level) gives every token its own reward: in a correct ("O+") completion a token's
  share of the bonus grows with its entropy, in a wrong ("O-") one its share of the penalty grows
  with its *inverse* entropy (a confident mistake is punished harder). Advantages are ``(N, T)``.
* GRPO-S (sequence level) does the same with each completion's mean token entropy; advantages
  are ``(N,)``, normalised within the group like GRPO's.

Pure functions: tensors in, tensors plus metrics out. The entropies are pi_old's, taken before the
update and carrying no gradient (the paper's Remark 2.5: the entropy term is detached).

The paper is written for 0/1 rewards. grpokit splits a group at its mean reward (O+: above the
mean, O-: the rest), which is the correct/wrong split for 0/1 rewards; O+ members get ``alpha1 * r_i``
and O- members ``-alpha1`` as the base, the paper's ``alpha1 r_i`` and ``alpha1 (-1)``. A group whose
rewards are all equal gets zero advantage, as everywhere in grpokit: the paper builds on DAPO,
whose dynamic sampling never lets such a group reach the advantages, and shaping it would only
turn entropy into a signal that says nothing about correctness.
"""

from __future__ import annotations

import torch

from .advantages import _mean, _stats, flat_groups, group_advantages

GTPO_NORMALIZATIONS: tuple[str, ...] = ("polarity", "joint")
ENTROPY_EPS = 1e-8  # the paper's Remark 2.1: keeps 1/H finite and H / sum(H) defined at H = 0


def _split(rewards_PG: torch.Tensor, flat_rtol: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(positive_PG, member_PG, valid_P)``: O+ membership (reward above the mean of the group's scored
    completions), the scored completions of non-flat groups (O+ and O- together), and the non-flat groups.
    An unscorable completion (NaN reward: no reward function scored it) is in neither set."""
    scored = ~torch.isnan(rewards_PG)
    valid_P = ~flat_groups(rewards_PG.float(), flat_rtol)  # NaN entries never count there
    member_PG = scored & valid_P[:, None]
    r = torch.nan_to_num(rewards_PG.float(), nan=0.0)
    return (r > _mean(r, 1, scored)) & member_PG, member_PG, valid_P


def gtpo_token_rewards(
    rewards_PG: torch.Tensor,
    entropy_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    alpha1: float = 1.0,
    alpha2: float = 0.1,
    flat_rtol: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GTPO's shaped token rewards (arXiv 2508.04349, eq. 3 for O+, eq. 5 for O-).

    At position t of a group, with ``d_t`` the O+ completions still running at t (``|o_i| > t``) and
    ``h_t`` the O- ones:

        O+:  r~[i,t] = alpha1 r_i + alpha2 * H[i,t] / sum_{k in O+_t} H[k,t] * d_t
        O-:  r~[j,t] = -alpha1 - alpha2 * (1/H[j,t]) / sum_{k in O-_t} (1/H[k,t]) * h_t

    The bonus shares of a position add up to ``alpha2 d_t`` (the paper's Proposition 2.2: with
    ``alpha1 + alpha2 = 1`` the O+ rewards of a position sum to ``d_t``). H is floored at
    ``ENTROPY_EPS`` (Remark 2.1), so all-zero entropies share equally.

    Args:
        rewards_PG: ``(P, G)`` outcome rewards; NaN for an unscorable completion (no reward function
            scored it): it belongs to neither set, so its tokens get 0 and count in no statistic.
        entropy_NT: ``(N, T)`` pi_old's token entropies, N = P*G rows grouped by prompt.
        mask_NT: ``(N, T)`` 1 on the completion's real tokens (its length |o_i|).

    Returns:
        ``(shaped_NT, positive_N, token_valid_NT)``: 0 off the mask and in flat groups; which rows are
        O+; which tokens take part in the normalisation (real tokens of non-flat groups).
    """
    P, G = rewards_PG.shape
    T = entropy_NT.shape[1]
    positive_PG, member_PG, _ = _split(rewards_PG, flat_rtol)
    m = mask_NT.float().view(P, G, T) * member_PG[:, :, None].float()
    H = entropy_NT.detach().float().view(P, G, T).clamp(min=0.0) + ENTROPY_EPS
    pos = m * positive_PG[:, :, None].float()  # (P, G, T) running O+ tokens
    neg = m - pos  # running O- tokens
    d_t = pos.sum(dim=1, keepdim=True)  # (P, 1, T)
    h_t = neg.sum(dim=1, keepdim=True)
    share_pos = H * pos / (H * pos).sum(dim=1, keepdim=True).clamp(min=1e-30)  # GTPO eq. 3: H / sum H
    inv = pos.new_ones(()) / H
    share_neg = inv * neg / (inv * neg).sum(dim=1, keepdim=True).clamp(min=1e-30)  # GTPO eq. 5: (1/H) / sum (1/H)
    r_PG1 = torch.nan_to_num(rewards_PG.float(), nan=0.0)[:, :, None]  # an unscorable row is in neither set
    shaped = (alpha1 * r_PG1 + alpha2 * share_pos * d_t) * pos - (alpha1 + alpha2 * share_neg * h_t) * neg
    return shaped.view(P * G, T), positive_PG.flatten(), m.view(P * G, T) > 0


def _moments(x: torch.Tensor, std: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of a 1-d tensor; fewer values than the std needs give std 0."""
    if x.numel() == 0:
        return x.new_zeros(()), x.new_zeros(())
    correction = 1 if std == "unbiased" else 0
    sd = x.std(correction=correction) if x.numel() > correction else x.new_zeros(())
    return x.mean(), sd


def gtpo_advantages(
    rewards_PG: torch.Tensor,
    entropy_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    alpha1: float = 1.0,
    alpha2: float = 0.1,
    normalization: str = "polarity",
    std: str = "unbiased",
    eps: float = 1e-4,
    flat_rtol: float = 1e-6,
    pools: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GTPO's per-token advantages ``(N, T)`` from the shaped rewards of ``gtpo_token_rewards``.

    ``normalization="polarity"`` is the paper's eq. 6: the batch's O+ tokens and its O- tokens are
    normalised separately, ``A+ = (r~+ - mean(R~+)) / (std(R~+) + eps)`` and likewise for O-. The
    paper does not say over how many groups R~+ runs; grpokit takes the whole batch (every rank),
    as the public implementations we read do, because within one group a single correct
    completion has a constant reward (``d_t = 1``: alpha1 + alpha2 at every token) and would get
    zero advantage. What eq. 6 implies, and a test pins: the mean advantage over the O+ tokens is
    0, so ``alpha1`` cancels and a correct completion whose tokens all have its group's typical
    entropy gets no push at all; the correct/wrong signal survives only as the direction in which
    entropy moves each set (up for uncertain tokens of correct answers, down for confident tokens
    of wrong ones). ``"joint"`` normalises all the batch's shaped token rewards together (our
    alternative, not the paper's eq. 6), which keeps the sign: correct completions' tokens stay
    above wrong ones'.

    ``pools``: the (O+, O-) token rewards the statistics are taken over, when the batch is larger
    than these rows (every rank's, under data parallelism). Default: this batch's.
    """
    if normalization not in GTPO_NORMALIZATIONS:
        raise ValueError(f"unknown GTPO normalization {normalization!r}; valid: {', '.join(GTPO_NORMALIZATIONS)}")
    shaped_NT, positive_N, valid_NT = gtpo_token_rewards(
        rewards_PG, entropy_NT, mask_NT, alpha1=alpha1, alpha2=alpha2, flat_rtol=flat_rtol
    )
    pos_NT = valid_NT & positive_N[:, None]
    neg_NT = valid_NT & ~positive_N[:, None]
    pool_pos, pool_neg = pools if pools is not None else (shaped_NT[pos_NT], shaped_NT[neg_NT])
    adv_NT = torch.zeros_like(shaped_NT)
    if normalization == "polarity":  # GTPO eq. 6: O+ and O- tokens normalised separately
        for sel, pool in ((pos_NT, pool_pos), (neg_NT, pool_neg)):
            mu, sd = _moments(pool, std)
            adv_NT = torch.where(sel, (shaped_NT - mu) / (sd + eps), adv_NT)
    else:  # one normalisation over all shaped tokens (GTPO v1's form): the sign survives
        mu, sd = _moments(torch.cat([pool_pos, pool_neg]), std)
        adv_NT = torch.where(valid_NT, (shaped_NT - mu) / (sd + eps), adv_NT)
    n_flat = int(flat_groups(rewards_PG.float(), flat_rtol).sum())
    P = rewards_PG.shape[0]
    metrics = {
        "frac_reward_zero_std": n_flat / P,
        "num_zero_std_groups": float(n_flat),
        **_stats("advantages", adv_NT[valid_NT]),
        **_stats("gtpo/shaped_reward", shaped_NT[valid_NT]),
    }
    return adv_NT, metrics


def grpo_s_rewards(
    rewards_PG: torch.Tensor,
    seq_entropy_PG: torch.Tensor,
    *,
    beta1: float = 1.0,
    beta2: float = 0.1,
    flat_rtol: float = 1e-6,
) -> torch.Tensor:
    """GRPO-S's shaped sequence rewards (arXiv 2508.04349, sec. 2.3, with eq. 8's mean entropy).

    With ``H^_i`` the mean token entropy of completion i (``seq_entropy_PG``), n = |O+| and
    m = |O-| of the group:

        O+:  r^_i = beta1 r_i + beta2 * H^_i / sum_{k in O+} H^_k * n
        O-:  r^_j = -beta1 - beta2 * (1/H^_j) / sum_{k in O-} (1/H^_k) * m

    Flat groups are returned unchanged (their advantage is zero anyway), and an unscorable completion's
    NaN too (``group_advantages`` leaves it out). Returns ``(P, G)``.
    """
    positive_PG, member_PG, valid_P = _split(rewards_PG, flat_rtol)
    H = seq_entropy_PG.detach().float().clamp(min=0.0) + ENTROPY_EPS
    pos = positive_PG.float()
    neg = (member_PG & ~positive_PG).float()
    share_pos = H * pos / (H * pos).sum(dim=1, keepdim=True).clamp(min=1e-30)
    share_neg = neg / H / (neg / H).sum(dim=1, keepdim=True).clamp(min=1e-30)
    shaped = (
        (beta1 * rewards_PG.float() + beta2 * share_pos * pos.sum(dim=1, keepdim=True)) * pos  # GRPO-S: O+
        - (beta1 + beta2 * share_neg * neg.sum(dim=1, keepdim=True)) * neg
    )  # GRPO-S: O-, inverse entropy
    shaped = torch.where(valid_P[:, None], shaped, rewards_PG.float())
    return torch.where(torch.isnan(rewards_PG), rewards_PG.float(), shaped)  # unscorable stays NaN


def grpo_s_advantages(
    rewards_PG: torch.Tensor,
    seq_entropy_PG: torch.Tensor,
    *,
    beta1: float = 1.0,
    beta2: float = 0.1,
    flat_rtol: float = 1e-6,
    **group_kwargs,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO-S's per-completion advantages ``(P, G)``: the shaped rewards of ``grpo_s_rewards``
    normalised within each group by ``group_advantages`` (``group_kwargs``: its baseline, scale,
    std, eps; the paper: group mean and std, GRPO's). Unlike GTPO's eq. 6 the two polarities are
    normalised together, so correct completions keep a positive advantage. A group flat in its
    *outcome* rewards gets zero, although its shaped rewards differ."""
    shaped_PG = grpo_s_rewards(rewards_PG, seq_entropy_PG, beta1=beta1, beta2=beta2, flat_rtol=flat_rtol)
    adv_PG, metrics = group_advantages(shaped_PG, flat_rtol=flat_rtol, **group_kwargs)
    flat_P = flat_groups(rewards_PG.float(), flat_rtol)
    adv_PG = torch.where(flat_P[:, None], torch.zeros_like(adv_PG), adv_PG)
    n_flat = int(flat_P.sum())
    metrics.update(
        {
            "frac_reward_zero_std": n_flat / rewards_PG.shape[0],
            "num_zero_std_groups": float(n_flat),
            **_stats("advantages", adv_PG[~torch.isnan(rewards_PG)]),
            **_stats("grpo_s/shaped_reward", shaped_PG[~flat_P[:, None] & ~torch.isnan(shaped_PG)]),
        }
    )
    return adv_PG, metrics
