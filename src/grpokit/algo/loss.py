"""Stage 5b: the policy loss, as pure tensor functions.

Shapes: N sequences (completions), T completion tokens; ``mask_NT`` is 1 on real completion tokens.
The loss of token t of sequence i is

    l[i,t] = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)   (PPO clipped surrogate)
             (optionally bounded below by -dual_clip * A when A < 0: dual-clip PPO, Ye et al. 2020)
             + beta * KL_k[i,t]                                          (GRPO: KL in the loss)
               (optionally times the importance weight pi_theta / pi_old: DeepSeek-V3.2, TRL's default)

where ``rho`` is the importance ratio pi_theta / pi_old, per token (GRPO), per sequence (GSPO: a
geometric mean) or per trajectory (TIC-GRPO: the product), and ``A`` is the advantage, per sequence ``(N,)`` or per token ``(N, T)`` (process supervision).
The token losses are then reduced by one of the named ``AGGREGATIONS``. Two other ``OBJECTIVES``
replace the clipped surrogate (same ratio, KL, entropy and aggregation around them):

    cispo: l[i,t] = -sg(min(rho, 1 + clip_high)) * A * log pi_theta      (MiniMax-M1, CISPO)
    sapo:  l[i,t] = -sigmoid(tau * (rho - 1)) * 4 / tau * A,  tau = tau_pos if A > 0 else tau_neg  (SAPO)

Normalisers are arguments. Gradient accumulation splits a batch into micro-batches and sums their
losses; that equals the whole batch's loss only when every micro-batch divides by the *whole
batch's* token count / sequence count. So callers pass ``num_sequences`` and ``num_tokens`` of the
whole batch, and the reduction is a plain sum divided by them.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum", "lambda-grpo"]
AGGREGATIONS: tuple[str, ...] = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum",
                                 "lambda-grpo")
RATIO_LEVELS: tuple[str, ...] = ("token", "sequence", "turn", "trajectory")
OBJECTIVES: tuple[str, ...] = ("clip", "cispo", "sapo")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
ENTROPY_AGGREGATIONS: tuple[str, ...] = ("loss", "token-mean")


def kl_estimate(logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor, estimator: str = "k3",
                clamp: float | None = None) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta (Schulman 2020).

    With ``d = ref_logp - logp`` (log of pi_ref / pi_theta):
      * k1 = -d                       (unbiased, high variance, can be negative)
      * k2 = d^2 / 2                  (biased, low variance)
      * k3 = exp(d) - d - 1           (unbiased, low variance, always >= 0; DeepSeekMath's choice)

    ``clamp``: bound the estimate to ``[-clamp, clamp]`` (no gradient where it binds). verl clamps
    k3 at 10; its extra clamp of ``d`` to [-20, 20] never changes a k3 clamped at 19 or less, since
    ``|d| > 20`` already gives k3 > 19.
    """
    d = ref_logp_NT - logp_NT
    if estimator == "k1":
        kl = -d
    elif estimator == "k2":
        kl = 0.5 * d * d
    elif estimator == "k3":
        kl = torch.exp(d) - d - 1.0  # DeepSeekMath eq. (4)
    else:
        raise ValueError(f"unknown kl_estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
    if clamp is not None:
        if clamp <= 0:
            raise ValueError(f"kl clamp must be > 0 (or None for no clamp), got {clamp}")
        kl = kl.clamp(-clamp, clamp)  # verl: k3 clamped at 10 for numerical stability
    return kl


def aggregate(
    loss_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    mode: Aggregation,
    *,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    norm_constant: float | None = None,
    seq_weights_N: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to a scalar.

    * ``"seq-mean-token-mean"`` (GRPO, DeepSeekMath): ``1/N sum_i 1/|o_i| sum_t l[i,t]``
    * ``"token-mean"`` (DAPO): ``1/sum_i|o_i| sum_i sum_t l[i,t]``, every token weighs the same
    * ``"seq-mean-token-sum-norm"`` (Dr. GRPO): ``1/(N * C) sum_i sum_t l[i,t]`` with a fixed C
      such as the maximum completion length, so no length-dependent weighting
    * ``"seq-mean-token-sum"``: ``1/N sum_i sum_t l[i,t]``
    * ``"lambda-grpo"`` (arXiv 2510.06870): ``1/sum_i|o_i| sum_i f_i sum_t l[i,t]`` with per-sequence
      weights ``seq_weights_N`` = ``f`` (``lambda_weights``; carrying the gradient to lambda). With
      ``f = 1`` it is ``"token-mean"``; with ``f_i = sum_j|o_j| / (N |o_i|)`` it is ``"seq-mean-token-mean"``.

    ``num_sequences`` (N) and ``num_tokens`` (sum of |o_i|) default to this batch's own counts;
    pass the whole batch's counts when this is one micro-batch of it.
    """
    mask = mask_NT.to(loss_NT.dtype)
    n_seq = float(mask_NT.shape[0]) if num_sequences is None else float(num_sequences)
    n_tok = float(mask.sum().clamp(min=1).item()) if num_tokens is None else float(num_tokens)
    masked_NT = loss_NT * mask
    if mode == "seq-mean-token-mean":
        per_seq_N = masked_NT.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_seq_N.sum() / n_seq
    if mode == "token-mean":
        return masked_NT.sum() / max(n_tok, 1.0)  # DAPO: token-level loss
    if mode == "seq-mean-token-sum-norm":
        if norm_constant is None or norm_constant <= 0:
            raise ValueError("aggregation 'seq-mean-token-sum-norm' needs a positive norm_constant (e.g. max completion length)")
        return masked_NT.sum() / (n_seq * norm_constant)  # Dr. GRPO: divide by a constant
    if mode == "seq-mean-token-sum":
        return masked_NT.sum() / n_seq
    if mode == "lambda-grpo":
        if seq_weights_N is None:
            raise ValueError("aggregation 'lambda-grpo' needs seq_weights_N, the per-sequence weights f_lambda (N,)")
        return (masked_NT.sum(dim=1) * seq_weights_N.to(masked_NT.dtype)).sum() / max(n_tok, 1.0)  # lambda-GRPO: f_i weighs o_i's tokens
    raise ValueError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")


def lambda_weights(lengths_N: torch.Tensor, group_size: int, lam: torch.Tensor | float, *, r: float = 1 / 9,
                   floor: float = 1e-6, eps: float = 1e-8) -> torch.Tensor:
    """lambda-GRPO's per-completion weights ``f_lambda`` (Wang et al., arXiv 2510.06870), ``(N,)``.

    Within each group of G completions (rows grouped consecutively) with lengths ``|o_i|``:

        z_i = (|o_i| - mean_g |o|) / (std_g |o| + eps)     standardised length deviation (population std)
        h_i = max(1 + r z_i, floor)                         lifted to be positive
        f_i = G * softmax_i(h_i ** lambda)                  token-group weights, mean 1 over the group

    ``lambda = 0`` gives ``f = 1`` (DAPO's token-mean) whatever the lengths; ``lambda > 0`` moves
    weight to longer completions, ``lambda < 0`` to shorter ones (GRPO's ``1/|o_i|`` direction).
    Equal lengths give ``f = 1`` for any lambda. ``lam`` may be a tensor with gradient: the weights
    carry it. The floor is ours: the paper's lift ``1 + r z`` is positive only while ``r |z| < 1``
    (``r = 1/9`` keeps it so for |z| < 9), and ``h ** lambda`` needs ``h > 0``.
    """
    L = lengths_N.to(torch.float32).view(-1, group_size)
    z = (L - L.mean(dim=1, keepdim=True)) / (L.std(dim=1, keepdim=True, correction=0) + eps)
    h = (1.0 + r * z).clamp(min=floor)  # lambda-GRPO: lifted deviations h_i = 1 + r z_i
    lam_t = lam if isinstance(lam, torch.Tensor) else torch.tensor(float(lam))
    g = torch.pow(h, lam_t.to(h.device, h.dtype))  # lambda-GRPO: g_i = h_i ** lambda, learnable lambda
    return (group_size * torch.softmax(g, dim=1)).flatten()  # lambda-GRPO: f_i = G softmax(g)_i


def log_importance_ratio(
    logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, mask_NT: torch.Tensor, level: str = "token",
    turn_ids_NT: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log of the importance ratio pi_theta / pi_old for every token, ``(N, T)``.

    ``"token"``: ``logp - old_logp`` per token (PPO / GRPO).
    ``"sequence"`` (GSPO, Zheng et al. 2025): the length-normalised sequence log-ratio
    ``s_i = 1/|o_i| sum_t (logp - old_logp)``, one value per sequence, broadcast to its tokens in
    the GSPO-token form ``sg(s_i) + logp - sg(logp)``: its value is ``s_i`` on every token and its
    gradient flows through every token's logprob.
    ``"turn"`` (GAGPO's action-level ratio, arXiv 2605.13217): the same, per turn of a multi-turn
    episode: the mean log-ratio over the turn's masked tokens (``turn_ids_NT`` names each token's turn).
    ``"trajectory"`` (TIC-GRPO, Pang et al., arXiv 2508.02833): the log of the whole trajectory's
    probability ratio ``pi_theta(o_i|q) / pi_old(o_i|q)``, i.e. the *sum* ``S_i = sum_t (logp - old_logp)``
    (GSPO takes the mean: its ratio is the |o_i|-th root of this one). Broadcast to the tokens with its
    full gradient ``sum_t grad logp``, not the GSPO-token form, so that ``1/|o_i| sum_t`` of a token
    loss that is constant over the sequence is exactly the paper's per-trajectory surrogate.
    """
    log_ratio_NT = logp_NT - old_logp_NT
    if level == "token":
        return log_ratio_NT
    if level == "turn":
        if turn_ids_NT is None:
            raise ValueError("ratio level 'turn' needs turn_ids_NT (the turn of every token)")
        mask = mask_NT.to(logp_NT.dtype)
        ids = turn_ids_NT.clamp(min=0).long()
        K = int(ids.max().item()) + 1 if ids.numel() else 1
        sums = torch.zeros(logp_NT.shape[0], K, dtype=logp_NT.dtype, device=logp_NT.device)
        counts = torch.zeros_like(sums)
        sums.scatter_add_(1, ids, (log_ratio_NT * mask).detach())
        counts.scatter_add_(1, ids, mask)
        turn_NT = (sums / counts.clamp(min=1)).gather(1, ids)  # GAGPO: action-level (per-turn) log-ratio
        return turn_NT + logp_NT - logp_NT.detach()
    if level == "trajectory":
        mask = mask_NT.to(logp_NT.dtype)
        traj_N = (log_ratio_NT * mask).sum(dim=1)  # TIC-GRPO: log of prod_t rho_t = pi(o|q) / pi_old(o|q)
        return traj_N[:, None].expand_as(logp_NT)
    if level == "sequence":
        mask = mask_NT.to(logp_NT.dtype)
        seq_N = (log_ratio_NT * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # GSPO: s_i
        return seq_N.detach()[:, None] + logp_NT - logp_NT.detach()  # GSPO-token form
    raise ValueError(f"unknown ratio level {level!r}; valid: {', '.join(RATIO_LEVELS)}")


def policy_loss(
    logp_NT: torch.Tensor,
    old_logp_NT: torch.Tensor,
    advantages: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ratio_level: str = "token",
    ref_logp_NT: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: str = "k3",
    kl_bias_correction: bool = False,
    kl_clamp: float | None = None,
    aggregation: Aggregation = "seq-mean-token-mean",
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    norm_constant: float | None = None,
    entropy_NT: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    entropy_aggregation: str = "loss",
    offpolicy_delta: float | None = None,
    turn_ids_NT: torch.Tensor | None = None,
    objective: str = "clip",
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    seq_weights_N: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped-surrogate policy loss with an optional KL penalty to a reference policy.

    Args:
        logp_NT: ``(N, T)`` log pi_theta of the sampled completion tokens (requires grad).
        old_logp_NT: ``(N, T)`` log pi_old of the same tokens (the policy that sampled them,
            detached). When it equals ``logp_NT`` numerically the ratio is 1 and the loss is
            REINFORCE with baseline: ``-A * logp`` in gradient.
        advantages: ``(N,)`` per sequence or ``(N, T)`` per token.
        mask_NT: ``(N, T)`` 1 for completion tokens that count, 0 for padding / masked tokens.
        clip_low, clip_high: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``;
            ``clip_high > clip_low`` is DAPO's clip-higher.
        dual_clip: if set (> 1), for negative advantages the objective is bounded below by
            ``dual_clip * A`` (dual-clip PPO), so a huge ratio cannot produce a huge loss.
        ratio_level: ``"token"`` (GRPO), ``"sequence"`` (GSPO), ``"turn"`` (GAGPO, with
            ``turn_ids_NT``) or ``"trajectory"`` (TIC-GRPO), see ``log_importance_ratio``.
        objective: what multiplies the advantage, see ``surrogate``: ``"clip"`` (PPO/GRPO clipped
            surrogate), ``"cispo"`` (MiniMax-M1: stop-gradient IS weight truncated at
            ``1 + clip_high`` on a REINFORCE term; ``clip_low`` and ``dual_clip`` are not used) or
            ``"sapo"`` (soft sigmoid gate with temperatures ``sapo_tau_pos`` / ``sapo_tau_neg``).
        ref_logp_NT: ``(N, T)`` log pi_ref; only needed (and only read) when ``beta > 0``.
        beta: KL penalty weight; ``beta = 0`` skips the KL term entirely.
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"``, see ``kl_estimate``.
        kl_bias_correction: multiply the per-token KL by the importance weight pi_theta / pi_old
            (per token, or the sequence weight ``exp(mean_t log ratio)`` at ``ratio_level=
            "sequence"``), gradient included (DeepSeek-V3.2; TRL's ``use_bias_correction_kl``). Its
            gradient differs even on-policy, where the weight's value is 1.
        kl_clamp: bound each token's KL estimate to ``[-kl_clamp, kl_clamp]`` (verl: k3 at 10);
            None = no clamp.
        aggregation, num_sequences, num_tokens, norm_constant, seq_weights_N: see ``aggregate``.
        entropy_NT, entropy_coef: entropy bonus; ``entropy_coef * H`` is subtracted from every token's
            loss (``entropy_NT`` must carry gradient for the bonus to act).
        entropy_aggregation: how the bonus is reduced: ``"loss"`` (with the token losses, through
            ``aggregation``, as verl does) or ``"token-mean"`` (its own mean over the batch's
            ``num_tokens`` mask tokens, as TRL does; the off-policy mask does not apply to it).
        offpolicy_delta: off-policy sequence masking (DeepSeek-V3.2): a sequence with negative
            advantage whose mean log-ratio ``1/|o| sum_t (old_logp - logp)`` exceeds this threshold
            is left out of the loss (its tokens still count in the normalisers).

    Returns:
        ``(loss, metrics)``; metrics are masked token means over this batch:
        ``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean``,
        ``clip_ratio/dual_mean``, ``ratio/mean``, ``kl`` (when beta > 0).
    """
    if not (0.0 <= clip_low < 1.0):
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    if entropy_aggregation not in ENTROPY_AGGREGATIONS:
        raise ValueError(f"unknown entropy_aggregation {entropy_aggregation!r}; valid: {', '.join(ENTROPY_AGGREGATIONS)}")

    adv_NT = advantages[:, None].expand_as(logp_NT) if advantages.dim() == 1 else advantages
    adv_NT = adv_NT.to(logp_NT.dtype)
    loss_mask_NT = mask_NT
    n_offpolicy = 0.0
    if offpolicy_delta is not None:
        drop_N = offpolicy_sequences(logp_NT.detach(), old_logp_NT, adv_NT, mask_NT, offpolicy_delta)
        loss_mask_NT = mask_NT * (~drop_N)[:, None].to(mask_NT.dtype)  # DeepSeek-V3.2: off-policy sequence masking
        n_offpolicy = float(drop_N.sum())
    ratio_NT = torch.exp(log_importance_ratio(logp_NT, old_logp_NT, mask_NT, ratio_level, turn_ids_NT))

    loss_NT = -surrogate(ratio_NT, adv_NT, logp_NT, objective, clip_low=clip_low, clip_high=clip_high,
                         dual_clip=dual_clip, tau_pos=sapo_tau_pos, tau_neg=sapo_tau_neg)

    kl_NT = None
    if beta != 0.0:
        if ref_logp_NT is None:
            raise ValueError("beta > 0 needs ref_logp_NT (reference-policy logprobs)")
        kl_NT = kl_estimate(logp_NT, ref_logp_NT, kl_estimator, clamp=kl_clamp)
        if kl_bias_correction:  # DeepSeek-V3.2: unbiased KL gradient from samples of pi_old
            kl_NT = kl_NT * _kl_weight(logp_NT, old_logp_NT, mask_NT, ratio_level)
        loss_NT = loss_NT + beta * kl_NT  # GRPO: KL in the loss, not in the reward
    bonus_NT = None
    if entropy_coef != 0.0:
        if entropy_NT is None:
            raise ValueError("entropy_coef != 0 needs entropy_NT")
        bonus_NT = entropy_coef * entropy_NT  # entropy bonus: rewards keeping the policy spread
        if entropy_aggregation == "loss":
            loss_NT = loss_NT - bonus_NT

    loss = aggregate(
        loss_NT, loss_mask_NT, aggregation, num_sequences=num_sequences, num_tokens=num_tokens, norm_constant=norm_constant,
        seq_weights_N=seq_weights_N,
    )
    if bonus_NT is not None and entropy_aggregation == "token-mean":  # TRL: a plain token mean
        loss = loss - aggregate(bonus_NT, mask_NT, "token-mean", num_tokens=num_tokens)

    with torch.no_grad():
        m = mask_NT.bool()
        low = (ratio_NT < 1.0 - clip_low) & (adv_NT < 0) & m
        high = (ratio_NT > 1.0 + clip_high) & (adv_NT > 0) & m
        if objective == "cispo":  # CISPO truncates the weight from above only, whatever the sign of A
            low, high = torch.zeros_like(m), (ratio_NT > 1.0 + clip_high) & m
        elif objective == "sapo":  # SAPO clips nothing: its gate fades the update smoothly
            low, high = torch.zeros_like(m), torch.zeros_like(m)
        dual = (ratio_NT > dual_clip) & (adv_NT < 0) & m if dual_clip is not None else torch.zeros_like(m)
        n = m.sum().clamp(min=1).float()
        metrics = {
            "clip_ratio/low_mean": (low.sum() / n).item(),
            "clip_ratio/high_mean": (high.sum() / n).item(),
            "clip_ratio/region_mean": ((low | high).sum() / n).item(),
            "clip_ratio/dual_mean": (dual.sum() / n).item(),
            "ratio/mean": (ratio_NT[m].sum() / n).item(),
            "num_tokens": float(m.sum().item()),
            "offpolicy/masked_sequences": n_offpolicy,
        }
        if kl_NT is not None:
            metrics["kl"] = (kl_NT[m].sum() / n).item()
    return loss, metrics


def surrogate(ratio_NT: torch.Tensor, adv_NT: torch.Tensor, logp_NT: torch.Tensor, objective: str = "clip", *,
              clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
              tau_pos: float = 1.0, tau_neg: float = 1.05) -> torch.Tensor:
    """The per-token objective to maximise, ``(N, T)``; the loss is its negative.

    * ``"clip"`` (PPO / GRPO): ``min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)``, with the
      dual-clip bound ``max(., dual_clip A)`` for ``A < 0`` when ``dual_clip`` is set.
    * ``"cispo"`` (MiniMax-M1, arXiv 2506.13585, Sec. 3.1 eqs. 4-5): ``sg(r_hat) A log pi_theta`` with
      ``r_hat = min(rho, 1 + clip_high)``. The weight carries no gradient, so every token keeps its
      gradient ``r_hat A grad log pi`` (PPO's clip zeroes it). The paper's ``r_hat`` is
      ``clip(rho, 1 - eps_low, 1 + eps_high)`` but it sets ``eps_low`` large, i.e. no lower bound;
      we take that setting, as TRL and the paper's runs do, so ``clip_low`` is not used here.
    * ``"sapo"`` (Gao et al., Soft Adaptive Policy Optimization, arXiv 2511.20347, the SAPO
      objective with its soft gate): ``f(rho) A`` with ``f(x) = sigmoid(tau (x - 1)) 4 / tau`` and
      ``tau = tau_pos`` where ``A > 0``, else ``tau_neg``. Its gradient ``4 sigmoid(1 - sigmoid)
      rho grad log pi A`` equals REINFORCE's at ``rho = 1`` and fades smoothly off-policy instead of
      stopping at a hard boundary; ``tau_neg > tau_pos`` fades negative updates faster.
    """
    if objective == "clip":
        surr_unclipped_NT = ratio_NT * adv_NT
        surr_clipped_NT = torch.clamp(ratio_NT, 1.0 - clip_low, 1.0 + clip_high) * adv_NT  # DAPO: clip-higher
        objective_NT = torch.minimum(surr_unclipped_NT, surr_clipped_NT)
        if dual_clip is not None:
            # Dual-clip PPO: for A < 0 never let the objective fall below dual_clip * A.
            bounded_NT = torch.maximum(objective_NT, dual_clip * adv_NT)
            objective_NT = torch.where(adv_NT < 0, bounded_NT, objective_NT)
        return objective_NT
    if objective == "cispo":
        weight_NT = torch.clamp(ratio_NT, max=1.0 + clip_high).detach()  # CISPO (MiniMax-M1 eq. 5): sg(clipped IS weight)
        return weight_NT * adv_NT * logp_NT  # CISPO (eq. 4): REINFORCE term, no token's gradient dropped
    if objective == "sapo":
        if tau_pos <= 0 or tau_neg <= 0:
            raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
        tau_NT = torch.where(adv_NT > 0, torch.full_like(adv_NT, tau_pos), torch.full_like(adv_NT, tau_neg))
        gate_NT = torch.sigmoid(tau_NT * (ratio_NT - 1.0)) * (4.0 / tau_NT)  # SAPO: soft gate f(r) = sigma(tau(r-1)) 4/tau
        return gate_NT * adv_NT
    raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")


def _kl_weight(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, mask_NT: torch.Tensor, level: str) -> torch.Tensor:
    """The importance weight pi_theta / pi_old that multiplies the KL under ``kl_bias_correction``,
    with its gradient: per token, or ``exp(1/|o| sum_t log ratio)`` per sequence (a plain sequence
    weight, as TRL's ``use_bias_correction_kl`` uses it, not the GSPO-token form); at
    ``"trajectory"`` level the trajectory weight ``exp(sum_t log ratio)``."""
    log_ratio_NT = logp_NT - old_logp_NT
    if level == "token":
        return torch.exp(log_ratio_NT)
    mask = mask_NT.to(logp_NT.dtype)
    seq_N = (log_ratio_NT * mask).sum(dim=1)
    if level != "trajectory":  # TIC-GRPO's weight is the product, the others the geometric mean
        seq_N = seq_N / mask.sum(dim=1).clamp(min=1)
    return torch.exp(seq_N)[:, None].expand_as(logp_NT)


def offpolicy_sequences(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, adv_NT: torch.Tensor,
                        mask_NT: torch.Tensor, delta: float) -> torch.Tensor:
    """Boolean ``(N,)``: sequences to mask under DeepSeek-V3.2's off-policy sequence masking.

    A sequence is masked when its mean advantage is negative and the policy has drifted from the
    one that sampled it by more than ``delta`` in mean log-ratio:
    ``1/|o| sum_t (old_logp - logp) > delta`` (a sample estimate of KL(pi_old || pi_theta)).
    Positive-advantage sequences are always kept: learning from a good sample stays useful.
    """
    mask = mask_NT.to(logp_NT.dtype)
    n_N = mask.sum(dim=1).clamp(min=1)
    drift_N = ((old_logp_NT - logp_NT) * mask).sum(dim=1) / n_N
    adv_N = (adv_NT * mask).sum(dim=1) / n_N
    return (adv_N < 0) & (drift_N > delta)


def entropy_token_mask(entropy_NT: torch.Tensor, mask_NT: torch.Tensor, top_fraction: float,
                       pool: torch.Tensor | None = None) -> torch.Tensor:
    """Keep only the highest-entropy ``top_fraction`` of the batch's completion tokens.

    "Beyond the 80/20 rule" (Wang et al., 2025): the gradient of the few high-entropy "forking"
    tokens carries most of the RL signal. The threshold is the ``1 - top_fraction`` quantile of the
    entropies of all real tokens of the batch; tokens at or above it stay in the mask.

    ``pool`` (1-d): the entropies the quantile is taken over, when the batch is larger than these
    rows; with several ranks it is every rank's real-token entropies, so each rank keeps exactly
    the tokens one process would keep of the whole batch. Default: ``entropy_NT[mask_NT > 0]``.
    """
    if not (0.0 < top_fraction <= 1.0):
        raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
    real = mask_NT.bool()
    pool = entropy_NT[real] if pool is None else pool
    if top_fraction == 1.0 or pool.numel() == 0:
        return mask_NT
    threshold = torch.quantile(pool.float(), 1.0 - top_fraction)
    return mask_NT * (entropy_NT >= threshold).to(mask_NT.dtype)
