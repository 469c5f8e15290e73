"""Truncated importance sampling, worked by hand."""

import math

import pytest
import torch

from grpokit.algo.loss import policy_loss
from grpokit.algo.tis import pad_sampling_logprobs, tis_weights


def test_weights_and_metrics_by_hand():
    # row 0: old - sampler = [0, ln 3, -ln 2] -> ratios [1, 3, 0.5] -> capped at 2: [1, 2, 0.5]
    # row 1: one real token, old - sampler = ln 1.5 -> 1.5; the padded position gets weight 1
    old = torch.tensor([[-1.0, -1.0 + math.log(3), -1.0 - math.log(2)], [-2.0 + math.log(1.5), 0.0, 0.0]])
    samp = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 0, 0]])
    w, m = tis_weights(old, samp, mask, cap=2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, 0.5], [1.5, 1.0, 1.0]]), atol=1e-6)
    # |diff| over the 4 real tokens: (0 + ln3 + ln2 + ln1.5) / 4 = ln(9) / 4
    assert m["tis/logp_abs_diff_mean"] == pytest.approx(math.log(9) / 4, rel=1e-5)
    assert m["tis/ratio_max"] == pytest.approx(3.0, rel=1e-5)
    assert m["tis/ratio_mean"] == pytest.approx((1 + 3 + 0.5 + 1.5) / 4, rel=1e-5)
    assert m["tis/capped_fraction"] == pytest.approx(0.25)


def test_equal_logprobs_give_unit_weights():
    x = torch.randn(3, 4)
    w, m = tis_weights(x, x.clone(), torch.ones(3, 4), cap=2.0)
    assert torch.equal(w, torch.ones(3, 4)) and m["tis/logp_abs_diff_mean"] == 0.0


def test_weighted_advantages_are_the_weighted_clipped_loss():
    # w > 0 commutes with the clipped surrogate: loss(w * A) per token == w * loss(A) per token
    torch.manual_seed(0)
    logp, old = torch.randn(2, 3), torch.randn(2, 3)
    adv = torch.tensor([1.0, -2.0])
    w = torch.tensor([[1.0, 2.0, 0.5], [1.5, 0.3, 1.0]])
    mask = torch.ones(2, 3)
    loss_w, _ = policy_loss(logp, old, adv[:, None] * w, mask, aggregation="token-mean", dual_clip=3.0)
    per_token = []
    for i in range(2):
        for t in range(3):
            one = torch.zeros(2, 3)
            one[i, t] = 1
            lt, _ = policy_loss(logp, old, adv, one, aggregation="token-mean", num_tokens=1.0, dual_clip=3.0)
            per_token.append(w[i, t] * lt)
    assert loss_w.item() == pytest.approx((sum(per_token) / 6).item(), rel=1e-5)


def test_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="cap must be >= 1"):
        tis_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), cap=0.5)


def test_pad_sampling_logprobs():
    assert pad_sampling_logprobs([[-1.0, -2.0], [-3.0]], 3).tolist() == [[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]]


# TRL's four modes on one batch, bounds [floor 0.6, cap 2]. Ratios r = exp(old - sampler):
#   row 0: [1, 3, 0.5]      product 1.5
#   row 1: [1.5, pad, pad]  product 1.5
#   row 2: [2, 2, pad]      product 4 (geometric mean 2: MIS would keep it, the product is outside)
_OLD = torch.tensor([[0.0, math.log(3), -math.log(2)], [math.log(1.5), 0, 0], [math.log(2), math.log(2), 0]])
_MASK = torch.tensor([[1.0, 1, 1], [1, 0, 0], [1, 1, 0]])
_MODES = {  # padding keeps weight 1
    "token_truncate": [[1, 2, 0.6], [1.5, 1, 1], [2, 2, 1]],  # 3 -> 2, 0.5 -> 0.6
    "token_mask": [[1, 0, 0], [1.5, 1, 1], [2, 2, 1]],  # 3 and 0.5 are outside; 2 is on the bound, kept
    "sequence_truncate": [[1.5] * 3, [1.5, 1, 1], [2, 2, 1]],  # row 2: 4 -> 2
    "sequence_mask": [[1.5] * 3, [1.5, 1, 1], [0, 0, 1]],  # row 2: 4 is outside
}


@pytest.mark.parametrize("mode", sorted(_MODES))
def test_every_trl_mode_by_hand(mode):
    w, m = tis_weights(_OLD, torch.zeros(3, 3), _MASK, cap=2.0, mode=mode, floor=0.6)
    assert torch.allclose(w, torch.tensor(_MODES[mode]), atol=1e-6)
    assert m["tis/capped_fraction"] == pytest.approx(2 / 6)  # two of the six real tokens changed in every mode
    # |log r| over the 6 real tokens: (0 + ln3 + ln2 + ln1.5 + 2 ln2) / 6 = ln(36) / 6, the largest ln 3
    assert m["sampling/sampling_logp_difference/mean"] == pytest.approx(math.log(36) / 6, rel=1e-5)
    assert m["sampling/sampling_logp_difference/max"] == pytest.approx(math.log(3), rel=1e-5)


def test_trl_ratio_metrics_by_hand():
    # token_mask: the 6 real tokens' weights [1, 0, 0, 1.5, 2, 2]: min 0, mean 6.5 / 6, max 2
    _, m = tis_weights(_OLD, torch.zeros(3, 3), _MASK, cap=2.0, mode="token_mask", floor=0.6)
    got = [m[f"sampling/importance_sampling_ratio/{k}"] for k in ("min", "mean", "max")]
    assert got == pytest.approx([0.0, 6.5 / 6, 2.0], rel=1e-5)
    # sequence_mask: one weight per row [1.5, 1.5, 0]: min 0, mean 1, max 1.5
    _, m = tis_weights(_OLD, torch.zeros(3, 3), _MASK, cap=2.0, mode="sequence_mask", floor=0.6)
    got = [m[f"sampling/importance_sampling_ratio/{k}"] for k in ("min", "mean", "max")]
    assert got == pytest.approx([0.0, 1.0, 1.5], rel=1e-5)


def test_no_bounds_and_unscored_tokens():
    # cap inf, floor 0: the mask modes keep every ratio, truncation changes nothing
    w, _ = tis_weights(_OLD, torch.zeros(3, 3), _MASK, cap=math.inf, mode="sequence_mask")
    assert torch.allclose(w, torch.tensor([[1.5] * 3, [1.5, 1, 1], [4, 4, 1]]), atol=1e-6)
    # a NaN sampler logprob (the sampler did not score it) counts as ratio 1 and is left out of the difference
    samp = torch.zeros(3, 3)
    samp[0, 1] = float("nan")
    w, m = tis_weights(_OLD, samp, _MASK, cap=2.0, mode="sequence_truncate", floor=0.6)
    assert w[0].tolist() == pytest.approx([0.6] * 3)  # row 0: 1 * 1 * 0.5 = 0.5 -> 0.6
    assert m["sampling/sampling_logp_difference/max"] == pytest.approx(math.log(2), rel=1e-5)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="TIS mode must be one of"):
        tis_weights(_OLD, torch.zeros(3, 3), _MASK, cap=2.0, mode="sequence_clip")
