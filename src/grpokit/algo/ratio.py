"""The importance ratio pi_theta / pi_old at each ``algo.ratio_level`` (token: GRPO; sequence and
sequence_whole: GSPO; turn: GAGPO; trajectory: TIC-GRPO), as a log ratio ``(N, T)`` broadcast to the tokens
with the gradient each paper gives it, and the importance weight that multiplies the KL under
``kl_bias_correction``. loss.py builds the objectives on these.

GSPO's two forms (Zheng et al. 2025) have the same value, ``s_i`` on every token of sequence i, and differ in
where its gradient goes. They give the same gradient while every token of a sequence weighs the same in the
policy term; they part where a per-token factor does not (the entropy top-fraction's mask, TIS's token weights,
per-token advantages):

* ``sequence`` (GSPO-token, the paper's eq. for token-wise advantages): token t's ratio
  ``sg(s_i) pi(t) / sg(pi(t))`` carries token t's gradient only, so a token whose policy term is masked or
  weighted gets exactly that share of the gradient (a masked token: none);
* ``sequence_whole`` (GSPO's sequence objective, TRL's ``importance_sampling_level="sequence"``): ``s_i``
  itself, whose gradient ``s_i / |o_i| sum_t grad log pi(t)`` reaches every token of the sequence from
  every token's term, so a per-token factor scales the whole sequence's gradient (a token outside the
  entropy mask still moves through the others' terms)."""

from __future__ import annotations

import torch

RATIO_LEVELS: tuple[str, ...] = ("token", "sequence", "sequence_whole", "turn", "trajectory")


def log_importance_ratio(
    logp_NT: torch.Tensor,
    old_logp_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    level: str = "token",
    turn_ids_NT: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log of the importance ratio pi_theta / pi_old for every token, ``(N, T)``.

    ``"token"``: ``logp - old_logp`` per token (PPO / GRPO).
    ``"sequence"`` (GSPO, Zheng et al. 2025): the length-normalised sequence log-ratio
    ``s_i = 1/|o_i| sum_t (logp - old_logp)``, one value per sequence, broadcast to its tokens in
    the GSPO-token form ``sg(s_i) + logp - sg(logp)``: its value is ``s_i`` on every token and its
    gradient flows through every token's logprob, each token's ratio carrying its own token's gradient only.
    ``"sequence_whole"`` (GSPO's sequence objective, as TRL computes it): the same ``s_i`` broadcast with its
    whole gradient, so each token's term reaches every token of its sequence (the module docstring says
    where the two forms part).
    ``"turn"`` (GAGPO's action-level ratio, arXiv 2605.13217): the same, per turn of a multi-turn
    episode: the mean log-ratio over the turn's masked tokens (``turn_ids_NT`` names each token's turn).
    ``"trajectory"`` (TIC-GRPO, Pang et al., arXiv 2508.02833): the log of the whole trajectory's
    probability ratio ``pi_theta(o_i|q) / pi_old(o_i|q)``, i.e. the *sum* ``S_i = sum_t (logp - old_logp)``
    (GSPO takes the mean: its ratio is the |o_i|-th root of this one). Broadcast to the tokens with its
    full gradient ``sum_t grad logp``, not the GSPO-token form, so that ``1/|o_i| sum_t`` of a token
    loss that is constant over the sequence is exactly the paper's per-trajectory surrogate.
    """
    if level not in RATIO_FNS:
        raise ValueError(f"unknown ratio level {level!r}; valid: {', '.join(RATIO_LEVELS)}")
    return RATIO_FNS[level](logp_NT, old_logp_NT, mask_NT, turn_ids_NT)


def _token_ratio(logp_NT, old_logp_NT, mask_NT, turn_ids_NT):
    return logp_NT - old_logp_NT  # PPO / GRPO: one ratio per token


def _mean_log_ratio(logp_NT, old_logp_NT, mask_NT):
    """``(N,)`` GSPO's ``log s_i = 1/|o_i| sum_t (logp - old_logp)`` over the masked tokens, with its gradient."""
    mask = mask_NT.to(logp_NT.dtype)
    return ((logp_NT - old_logp_NT) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # GSPO: log s_i


def _sequence_ratio(logp_NT, old_logp_NT, mask_NT, turn_ids_NT):
    seq_N = _mean_log_ratio(logp_NT, old_logp_NT, mask_NT)
    return seq_N.detach()[:, None] + logp_NT - logp_NT.detach()  # GSPO-token: token t carries its own gradient


def _sequence_whole_ratio(logp_NT, old_logp_NT, mask_NT, turn_ids_NT):
    seq_N = _mean_log_ratio(logp_NT, old_logp_NT, mask_NT)
    return seq_N[:, None].expand_as(logp_NT)  # GSPO's sequence objective: s_i with the whole sequence's gradient


def _turn_ratio(logp_NT, old_logp_NT, mask_NT, turn_ids_NT):
    if turn_ids_NT is None:
        raise ValueError("ratio level 'turn' needs turn_ids_NT (the turn of every token)")
    mask = mask_NT.to(logp_NT.dtype)
    ids = turn_ids_NT.clamp(min=0).long()
    K = int(ids.max().item()) + 1 if ids.numel() else 1
    sums = torch.zeros(logp_NT.shape[0], K, dtype=logp_NT.dtype, device=logp_NT.device)
    counts = torch.zeros_like(sums)
    sums.scatter_add_(1, ids, ((logp_NT - old_logp_NT) * mask).detach())
    counts.scatter_add_(1, ids, mask)
    turn_NT = (sums / counts.clamp(min=1)).gather(1, ids)  # GAGPO: action-level (per-turn) log-ratio
    return turn_NT + logp_NT - logp_NT.detach()


def _trajectory_ratio(logp_NT, old_logp_NT, mask_NT, turn_ids_NT):
    traj_N = ((logp_NT - old_logp_NT) * mask_NT.to(logp_NT.dtype)).sum(dim=1)  # TIC-GRPO: log prod_t rho_t
    return traj_N[:, None].expand_as(logp_NT)


# the ratio levels by config name (algo.ratio_level): (logp, old_logp, mask, turn_ids) -> log ratio (N, T)
RATIO_FNS = {
    "token": _token_ratio,
    "sequence": _sequence_ratio,
    "sequence_whole": _sequence_whole_ratio,
    "turn": _turn_ratio,
    "trajectory": _trajectory_ratio,
}


@torch.no_grad()
def unit_fractions(flag_NT: torch.Tensor, mask_NT: torch.Tensor, level: str) -> tuple[float, torch.Tensor, float]:
    """How a ratio level counts a per-token flag (e.g. "the objective clipped this ratio"):
    ``(mean, fractions_N, units)``, the flagged share of the level's units, each sequence's flagged share
    of its masked tokens, and the number of units.

    ``"token"``: the units are the masked tokens; a sequence without any has fraction NaN (no share).
    A sequence-wide level (sequence, turn, trajectory: one ratio per sequence or turn): the units are the
    sequences, each weighing one whatever its length (TRL counts GSPO's clipped sequences, not tokens);
    a sequence without masked tokens has fraction 0.
    """
    m = mask_NT.bool()
    hits_N, n_N = (flag_NT.bool() & m).sum(dim=1).float(), m.sum(dim=1).float()
    if level == "token":
        n = float(n_N.sum())
        return float(hits_N.sum()) / max(n, 1.0), hits_N / n_N, n  # 0 / 0 = NaN: a row without tokens
    fractions_N = hits_N / n_N.clamp(min=1)
    rows = float(fractions_N.numel())
    return float(fractions_N.sum()) / max(rows, 1.0), fractions_N, rows


def kl_weight(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, mask_NT: torch.Tensor, level: str) -> torch.Tensor:
    """The importance weight pi_theta / pi_old that multiplies the KL under ``kl_bias_correction``,
    with its gradient: per token, or ``exp(1/|o| sum_t log ratio)`` per sequence (a plain sequence
    weight, as TRL's ``use_bias_correction_kl`` uses it, not the GSPO-token form); at
    ``"trajectory"`` level the trajectory weight ``exp(sum_t log ratio)``."""
    if level == "token":
        return torch.exp(logp_NT - old_logp_NT)
    if level == "trajectory":  # TIC-GRPO's weight is the product, the others the geometric mean
        return torch.exp(_trajectory_ratio(logp_NT, old_logp_NT, mask_NT, None))
    return torch.exp(_mean_log_ratio(logp_NT, old_logp_NT, mask_NT))[:, None].expand_as(logp_NT)


def inert_at_ratio_one(a, updates_per_batch: int) -> list[str]:
    """The settings of ``a`` (AlgoConfig) that read the importance ratio, changed from GRPO's defaults, where the
    ratio is exactly 1 at every update: one update per sampled batch (``num_iterations`` 1, ``updates_per_batch``
    1) computes pi_old by the same weights it updates, so the clip range, the dual clip, a sequence-level ratio
    and SAPO's or CISPO's weighting give GRPO's gradient, and the off-policy mask's drift from pi_old is 0 (a stale
    sampler's drift is TIS's to correct, rollout.tis_cap). Empty where several updates per batch let them act."""
    if a.num_iterations > 1 or updates_per_batch > 1:
        return []
    from grpokit.config.algo import AlgoConfig

    plain = AlgoConfig()
    fields = ("clip_low", "clip_high", "dual_clip", "offpolicy_delta")  # the last: a drift from pi_old, 0 here
    changed = [f"algo.{f}={getattr(a, f)}" for f in fields if getattr(a, f) != getattr(plain, f)]
    changed += [f"algo.ratio_level={a.ratio_level}"] * (a.ratio_level != plain.ratio_level)
    changed += [f"algo.objective={a.objective}"] * (a.objective in ("sapo", "cispo"))
    return changed
