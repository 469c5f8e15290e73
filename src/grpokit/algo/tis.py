"""Truncated importance sampling (TIS): correcting for a sampler that is not the trained policy.

A separate inference engine (vLLM) computes slightly different probabilities than the trainer's
forward pass (other kernels, other numerics, bf16), and an asynchronous sampler uses weights some
steps old. The samples then come from pi_sampler, while the loss assumes they came from pi_old
(the trainer's policy before this update). The importance weight pi_old / pi_sampler corrects the
expectation; truncating it at a cap C bounds its variance (Yao et al., 2025, "Your efficient RL
framework secretly brings you off-policy RL training"):

    w_t = min(exp(logp_old_t - logp_sampler_t), C)

The weight multiplies each token's policy-gradient term: the pipeline's ``tis`` policy weight hands
``w_NT`` to the loss (``LossTensors.policy_weight``), which multiplies each token's objective by it, as TRL
multiplies its per-token loss by the ratio (the KL term stays unweighted). It is not folded into the
advantage: ``min(r * (w A), clip(r) * (w A)) = w * min(r A, clip(r) A)`` has the same value, but a weight
of 0 would then erase the advantage's sign, which the clip metrics and the off-policy mask read.
A weight of 0 (the mask modes below) leaves the token in the normaliser, as TRL's loss-side product does.

``rollout.tis_mode`` also selects TRL's other three corrections (``vllm_importance_sampling_mode``):
the weight masked to 0 outside ``[floor, cap]`` instead of truncated (``token_mask``), and both at
the sequence level, where the row's ratio is the PRODUCT of its token ratios (``sequence_*``; MIS in
``mismatch_mask`` below uses the geometric mean instead).

Pure: tensors in, ``(weights, metrics)`` out.
"""

from __future__ import annotations

import torch


def pad_sampling_logprobs(sampling_logprobs: list[list[float]], width: int) -> torch.Tensor:
    """``(N, width)`` tensor of the sampler's per-token logprobs, right-padded with 0."""
    out = torch.zeros(len(sampling_logprobs), width, dtype=torch.float32)
    for i, row in enumerate(sampling_logprobs):
        if row:
            out[i, : len(row)] = torch.tensor(row[:width], dtype=torch.float32)
    return out


def has_sampler_mismatch(backend: str, async_staleness: int) -> bool:
    """Whether the samples come from something other than the trainer's own forward on pi_old's weights: a
    vLLM engine (``rollout.backend``) or a sampler some versions behind (``rollout.async_staleness``). Only
    then does TIS have a ratio to correct; the synchronous hf engine samples with pi_old itself."""
    return backend != "hf" or async_staleness > 0


TIS_MODES = (
    "token_truncate",
    "token_mask",
    "sequence_truncate",
    "sequence_mask",
)  # TRL's vllm_importance_sampling_mode names


def tis_weights(
    old_logp_NT: torch.Tensor,
    sampler_logp_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    cap: float,
    mode: str = "token_truncate",
    floor: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token importance weights and the train/sampler mismatch metrics.

    With ``log r_t = old_t - sampler_t`` on real tokens (0 on padding and where the sampler's logprob
    is NaN), the ratio is ``r_t`` (``token_*``) or the row's product ``exp(sum_t log r_t)``
    broadcast to its tokens (``sequence_*``, as TRL: a product, not MIS's geometric mean).
    ``*_truncate`` clamps it to ``[floor, cap]``; ``*_mask`` keeps it inside ``[floor, cap]`` and sets
    it to 0 outside (floor 0: no lower bound, cap inf: no upper bound).

    Args:
        old_logp_NT: ``(N, T)`` log pi_old of the sampled tokens, computed by the trainer.
        sampler_logp_NT: ``(N, T)`` log pi_sampler of the same tokens, reported by the sampler.
        mask_NT: ``(N, T)`` 1 on real completion tokens.
        cap: C >= 1, the upper bound of the weight.
        mode: one of ``TIS_MODES``.
        floor: the lower bound (>= 0).

    Returns:
        ``(w_NT, metrics)``: the weights on real tokens and 1 on padding (no gradient); metrics
        ``tis/logp_abs_diff_mean`` (mean |old - sampler|), ``tis/ratio_max`` and ``tis/ratio_mean``
        (per-token ratios before the bounds), ``tis/capped_fraction`` (share of tokens whose weight
        the bounds changed), all over real tokens, and TRL's ``sampling/sampling_logp_difference/{mean,max}``
        and ``sampling/importance_sampling_ratio/{min,mean,max}`` (the weights: over real tokens, or
        over rows for ``sequence_*``).
    """
    if cap < 1.0:
        raise ValueError(f"the TIS cap must be >= 1, got {cap}")
    if mode not in TIS_MODES:
        raise ValueError(f"TIS mode must be one of {', '.join(TIS_MODES)}, got {mode!r}")
    m = mask_NT.bool()
    raw_NT = old_logp_NT.detach().float() - sampler_logp_NT.float()
    diff_NT = raw_NT.masked_fill(~m, 0.0).nan_to_num(nan=0.0)  # TRL: an unscored token gets ratio 1
    ratio_NT = torch.exp(diff_NT)
    sequence = mode.startswith("sequence")
    r = torch.exp(diff_NT.sum(dim=1, keepdim=True)) if sequence else ratio_NT  # (N, 1) or (N, T)
    if mode.endswith("truncate"):
        w = torch.clamp(r, min=floor, max=cap)
    else:  # mask: IcePop / MIS with the ratio kept as the weight, as TRL
        w = r.masked_fill((r < floor) | (r > cap), 0.0)
    w_NT = w.expand_as(ratio_NT).masked_fill(~m, 1.0)
    n = m.sum().clamp(min=1).float()
    metrics = {
        "tis/logp_abs_diff_mean": (diff_NT.abs().sum() / n).item(),
        "tis/ratio_max": (ratio_NT[m].max().item() if m.any() else 1.0),
        "tis/ratio_mean": (ratio_NT[m].sum() / n).item(),
        "tis/capped_fraction": ((w.expand_as(ratio_NT) != r.expand_as(ratio_NT)) & m).sum().item() / n.item(),
    }
    return w_NT, {**metrics, **_trl_metrics(raw_NT, m, w.flatten() if sequence else w[m])}


def _trl_metrics(raw_NT: torch.Tensor, m: torch.Tensor, w: torch.Tensor) -> dict[str, float]:
    """TRL's names for the sampler correction: |old - sampler| over scored real tokens, and the weights
    ``w`` (one per real token, or one per row) as TRL reports them (0 when there are none)."""
    delta = raw_NT.abs()[m & ~torch.isnan(raw_NT)]
    stat = lambda x, f: f(x).item() if x.numel() else 0.0  # noqa: E731
    return {
        "sampling/sampling_logp_difference/mean": stat(delta, torch.mean),
        "sampling/sampling_logp_difference/max": stat(delta, torch.max),
        "sampling/importance_sampling_ratio/min": stat(w, torch.min),
        "sampling/importance_sampling_ratio/mean": stat(w, torch.mean),
        "sampling/importance_sampling_ratio/max": stat(w, torch.max),
    }


# ---------------------------------------------------------------- mismatch: measured and masked
#
# The same numbers serve a metric every step and two corrections beside TIS. With r_t =
# pi_train(y_t) / pi_sampler(y_t) on tokens the sampler drew:
#   k3 = (r - 1) - log r estimates KL(pi_sampler || pi_train) (Schulman's k3; samples are the sampler's),
#   IcePop (Ring-1T report, 2025): a token whose r leaves [low, high] is left out of the gradient,
#   MIS, sequence level (masked importance sampling; Liu et al. 2025, "When Speed Kills Stability:
#   demystifying RL collapse from the training-inference mismatch"): a sequence whose geometric-mean
#   ratio exp(mean_t log r_t) leaves [low, high] is left out whole.


def sampled_rows(sampling_logprobs: list[list[float]]) -> torch.Tensor:
    """``(N,)`` 1.0 for rows the sampler scored, 0.0 for rows it did not (empty, or every logprob
    exactly 0.0: rows written by guided error correction carry placeholder zeros)."""
    return torch.tensor([float(any(v != 0.0 for v in row)) for row in sampling_logprobs])


def mismatch_sums(
    train_logp_NT: torch.Tensor, sampler_logp_NT: torch.Tensor, mask_NT: torch.Tensor, low: float, high: float
) -> dict[str, float]:
    """Sums over the masked tokens of one micro-batch, to add up over micro-batches and ranks.

    Keys: ``tokens``, ``abs_diff`` (sum |log r|), ``k3`` (sum (r - 1) - log r), ``outside`` (tokens
    whose r is outside ``[low, high]``) and ``abs_diff_max`` (a max, not a sum).
    """
    m = mask_NT.bool()
    d = (train_logp_NT.detach().double() - sampler_logp_NT.double())[m]  # log r, (tokens,)
    r = d.exp()
    return {
        "tokens": float(m.sum().item()),
        "abs_diff": d.abs().sum().item(),
        "k3": (r - 1 - d).sum().item(),
        "outside": float(((r < low) | (r > high)).sum().item()),
        "abs_diff_max": d.abs().max().item() if d.numel() else 0.0,
    }


def mismatch_metrics(sums: dict[str, float]) -> dict[str, float]:
    """``mismatch/*`` metrics from (added-up) ``mismatch_sums``: means over tokens, the max as is."""
    n = max(sums.get("tokens", 0.0), 1.0)
    return {
        "mismatch/logp_abs_diff_mean": sums.get("abs_diff", 0.0) / n,
        "mismatch/logp_abs_diff_max": sums.get("abs_diff_max", 0.0),
        "mismatch/k3_kl": sums.get("k3", 0.0) / n,
        "mismatch/outside_fraction": sums.get("outside", 0.0) / n,
    }


def mismatch_mask(
    old_logp_NT: torch.Tensor, sampler_logp_NT: torch.Tensor, mask_NT: torch.Tensor, mode: str, low: float, high: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(keep_NT, metrics)``: 1.0 where a token stays in the gradient, 0.0 where the mismatch masks it.

    ``mode``: "none" (keep all), "token" (IcePop: drop tokens with r outside [low, high]) or
    "sequence" (MIS: drop whole rows whose geometric-mean r is outside [low, high]). Padding keeps
    1.0 (its loss mask is 0 anyway). Metric ``mismatch/masked_fraction``: share of real tokens dropped.
    Example: log r = [log 3, 0] on one row, [0.5, 2]: token mode keeps [0, 1]; the row's geometric
    mean is sqrt(3) = 1.73, inside, so sequence mode keeps [1, 1].
    """
    if mode not in ("none", "token", "sequence"):
        raise ValueError(f"mismatch mask mode must be none, token or sequence, got {mode!r}")
    m = mask_NT.bool()
    d = (old_logp_NT.detach().double() - sampler_logp_NT.double()).masked_fill(~m, 0.0)  # log r
    if mode == "token":
        r = d.exp()
        keep = (r >= low) & (r <= high)
    elif mode == "sequence":
        r_seq = (d.sum(dim=1) / m.sum(dim=1).clamp(min=1)).exp()  # (N,) geometric mean of r
        keep = ((r_seq >= low) & (r_seq <= high))[:, None].expand_as(m)
    else:
        keep = torch.ones_like(m)
    keep = keep | ~m
    n = m.sum().clamp(min=1).item()
    return keep.to(old_logp_NT.dtype if old_logp_NT.is_floating_point() else torch.float32), {
        "mismatch/masked_fraction": float((~keep & m).sum().item()) / n
    }
