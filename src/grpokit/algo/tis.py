"""Truncated importance sampling (TIS): correcting for a sampler that is not the trained policy.

A separate inference engine (vLLM) computes slightly different probabilities than the trainer's
forward pass (other kernels, other numerics, bf16), and an asynchronous sampler uses weights some
steps old. The samples then come from pi_sampler, while the loss assumes they came from pi_old
(the trainer's policy before this update). The importance weight pi_old / pi_sampler corrects the
expectation; truncating it at a cap C bounds its variance (Yao et al., 2025, "Your efficient RL
framework secretly brings you off-policy RL training"):

    w_t = min(exp(logp_old_t - logp_sampler_t), C)

The weight multiplies each token's policy-gradient term. Because w_t > 0, multiplying the
advantage by it is the same as multiplying the clipped objective:
``min(r * (w A), clip(r) * (w A)) = w * min(r A, clip(r) A)``, so the trainer applies TIS by passing
per-token advantages ``w_NT * A`` to the unchanged ``loss.policy_loss`` (the KL term stays unweighted).

Pure: tensors in, ``(weights, metrics)`` out.
"""

from __future__ import annotations

import torch


def pad_sampling_logprobs(sampling_logprobs: list[list[float]], width: int) -> torch.Tensor:
    """``(N, width)`` tensor of the sampler's per-token logprobs, right-padded with 0."""
    out = torch.zeros(len(sampling_logprobs), width, dtype=torch.float32)
    for i, row in enumerate(sampling_logprobs):
        if row:
            out[i, :len(row)] = torch.tensor(row[:width], dtype=torch.float32)
    return out


def tis_weights(
    old_logp_NT: torch.Tensor,
    sampler_logp_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    cap: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token truncated importance weights and the train/sampler mismatch metrics.

    Args:
        old_logp_NT: ``(N, T)`` log pi_old of the sampled tokens, computed by the trainer.
        sampler_logp_NT: ``(N, T)`` log pi_sampler of the same tokens, reported by the sampler.
        mask_NT: ``(N, T)`` 1 on real completion tokens.
        cap: C >= 1, the truncation of the weight.

    Returns:
        ``(w_NT, metrics)``: ``w_NT = min(exp(old - sampler), cap)`` on real tokens and 1 on padding
        (no gradient); metrics ``tis/logp_abs_diff_mean`` (mean |old - sampler|),
        ``tis/ratio_max`` (largest untruncated ratio), ``tis/ratio_mean`` and ``tis/capped_fraction``
        (share of tokens whose weight was cut to the cap), all over real tokens.
    """
    if cap < 1.0:
        raise ValueError(f"the TIS cap must be >= 1, got {cap}")
    m = mask_NT.bool()
    diff_NT = (old_logp_NT.detach().float() - sampler_logp_NT.float()).masked_fill(~m, 0.0)
    ratio_NT = torch.exp(diff_NT)
    w_NT = torch.clamp(ratio_NT, max=cap).masked_fill(~m, 1.0)
    n = m.sum().clamp(min=1).float()
    metrics = {
        "tis/logp_abs_diff_mean": (diff_NT.abs().sum() / n).item(),
        "tis/ratio_max": (ratio_NT[m].max().item() if m.any() else 1.0),
        "tis/ratio_mean": (ratio_NT[m].sum() / n).item(),
        "tis/capped_fraction": ((ratio_NT > cap) & m).sum().item() / n.item(),
    }
    return w_NT, metrics
