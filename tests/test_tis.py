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
