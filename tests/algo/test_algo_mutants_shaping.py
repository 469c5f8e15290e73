"""Hand-worked cases for token masks and entropy shaping that kill mutants other tests let survive
(``make mutate``, docs/MUTATION.md): defaults used as shipped (std "unbiased", eps 1e-4, alpha2 0.1),
keywords passed through, ``<`` vs ``<=`` boundaries, per-group (not per-batch) sums, metric names.
"""

import math
import re

import pytest
import torch

from grpokit.algo.entropy_shaping import (
    _moments,
    grpo_s_advantages,
    grpo_s_rewards,
    gtpo_advantages,
    gtpo_token_rewards,
)
from grpokit.algo.masks import entropy_token_mask, offpolicy_sequences, truncated_sequences_mask


def close(a, b, tol):
    return torch.allclose(a, torch.tensor(b, dtype=torch.float32), atol=tol, rtol=0)


# ---------------------------------------------------------------- masks


def test_truncation_by_the_turn_limit_also_leaves_the_loss():
    # "length" (token limit) and "turns" (episode's turn limit) are both truncations; "stop" is not
    m = truncated_sequences_mask(torch.ones(3, 2), ["stop", "turns", "length"])
    assert torch.equal(m, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))


def test_offpolicy_masking_boundaries_and_one_token_sequences():
    # row 0: one real token, drift old - new = 0.5, adv -1: mean drift 0.5 / 1 token = 0.5 > 0.3 -> masked
    #        (a floor of 2 tokens would halve it to 0.25 and keep the row)
    # row 1: adv exactly 0 with a large drift: only negative advantages are masked -> kept
    # row 2: drift exactly delta (0.5 > 0.5 is false) -> kept
    logp = torch.zeros(3, 2)
    old = torch.tensor([[0.5, 9.0], [2.0, 2.0], [0.5, 0.5]])
    adv = torch.tensor([[-1.0, -1.0], [0.0, 0.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    assert offpolicy_sequences(logp, old, adv, mask, delta=0.3).tolist() == [True, False, True]
    assert offpolicy_sequences(logp, old, adv, mask, delta=0.5).tolist() == [False, False, False]


def test_entropy_mask_refuses_fractions_outside_zero_one():
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=re.escape(f"top_fraction must be in (0, 1], got {bad}")):
            entropy_token_mask(torch.ones(1, 2), torch.ones(1, 2), bad)


def test_entropy_mask_keeps_the_threshold_token_and_reads_the_given_pool():
    # entropies 1, 2, 3, top half: the 0.5 quantile of [1, 2, 3] is 2; tokens >= 2 stay (2 and 3)
    H, M = torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3)
    assert torch.equal(entropy_token_mask(H, M, 0.5), torch.tensor([[0.0, 1.0, 1.0]]))
    # a pool [3, 5, 7] (other ranks' tokens): quantile 0.5 = 5, so none of these rows' tokens stays
    assert torch.equal(entropy_token_mask(H, M, 0.5, pool=torch.tensor([3.0, 5.0, 7.0])), torch.zeros(1, 3))
    # top_fraction 1 keeps the mask as is, whatever the pool says
    assert torch.equal(entropy_token_mask(H, M, 1.0, pool=torch.tensor([5.0])), M)
    # no real token: nothing to take a quantile of, the (empty) mask comes back
    assert torch.equal(entropy_token_mask(H, torch.zeros(1, 3), 0.5), torch.zeros(1, 3))


# ---------------------------------------------------------------- GTPO


def test_gtpo_defaults_counts_per_position_and_small_entropy_sums():
    # one group [1, 0, 0], one token each, entropies 0.5 | 4, 4; defaults alpha1 1, alpha2 0.1
    # O+: share 0.5 / 0.5 = 1 (a floor of 1 on the sum would halve it), d_t = 1: 1 + 0.1 * 1 * 1 = 1.1
    # O-: 1/H = 0.25, 0.25 (sum 0.5, again below 1), shares 0.5; h_t = 2 O- rows at t:
    #     -1 - 0.1 * 0.5 * 2 = -1.1 (per-row token counts would give h = 1 and -1.05)
    shaped, pos, valid = gtpo_token_rewards(
        torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.5], [4.0], [4.0]]), torch.ones(3, 1)
    )
    assert close(shaped, [[1.1], [-1.1], [-1.1]], 1e-6)
    assert pos.tolist() == [True, False, False] and valid.all()


def test_split_uses_each_groups_own_mean_and_a_strict_above():
    # group A [1, 0.5, 0]: mean 0.5, the 0.5 is not above it -> O-;  group B [3, 3, 2]: mean 2.667 -> O+, O+, O-
    # (a batch mean of 1.583 would put all of B in O+, a flat B)
    _, pos, _ = gtpo_token_rewards(torch.tensor([[1.0, 0.5, 0.0], [3.0, 3.0, 2.0]]), torch.ones(6, 1), torch.ones(6, 1))
    assert pos.tolist() == [True, False, False, True, True, False]


def test_moments_edge_cases():
    # empty: zeros; one value: its mean and std 0 (unbiased needs two); two values [0, 2]: unbiased std sqrt(2)
    mu, sd = _moments(torch.tensor([]), "unbiased")
    assert mu.shape == () and sd.shape == () and mu.item() == 0.0 and sd.item() == 0.0
    mu, sd = _moments(torch.tensor([2.0]), "unbiased")
    assert mu.item() == 2.0 and sd.item() == 0.0
    mu, sd = _moments(torch.tensor([0.0, 2.0]), "unbiased")
    assert sd.item() == pytest.approx(math.sqrt(2)) and _moments(torch.tensor([0.0, 2.0]), "population")[1] == 1.0


def test_gtpo_joint_defaults_and_metrics():
    # P = 2 groups of G = 3, one token each, equal entropies; group 2 is flat (all 1) and stays out
    # group 1 shaped: O+ 1 + 0.1 = 1.1; O- shares 0.5, h_t 2: -1 - 0.1 = -1.1 -> pool [1.1, -1.1, -1.1]
    # mean -1.1/3 = -0.366667; deviations 1.466667, -0.733333 x2; squares sum 2.151111 + 2 * 0.537778 = 3.226667
    # unbiased var 1.613333, sd 1.270171; default eps 1e-4: A = dev / 1.270271 = 1.154608, -0.577304
    R = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv, m = gtpo_advantages(R, torch.ones(6, 1), torch.ones(6, 1), normalization="joint")
    assert close(adv, [[1.154608], [-0.577304], [-0.577304], [0.0], [0.0], [0.0]], 2e-6)
    assert m["frac_reward_zero_std"] == 0.5 and m["num_zero_std_groups"] == 1.0
    assert m["advantages/max"] == pytest.approx(1.154608, abs=2e-6)
    assert m["gtpo/shaped_reward/max"] == pytest.approx(1.1) and m["gtpo/shaped_reward/min"] == pytest.approx(-1.1)
    # alpha1 2, alpha2 0.5 reach the shaping: O+ 2 + 0.5 = 2.5, O- -2 - 0.5 * 0.5 * 2 = -2.5
    _, m = gtpo_advantages(R, torch.ones(6, 1), torch.ones(6, 1), normalization="joint", alpha1=2.0, alpha2=0.5)
    assert m["gtpo/shaped_reward/max"] == pytest.approx(2.5) and m["gtpo/shaped_reward/min"] == pytest.approx(-2.5)


def test_gtpo_polarity_defaults():
    # group [1, 0, 0], entropies 1 | 1, 4: O- 1/H = 1, 0.25 (sum 1.25) -> shares 0.8, 0.2, h_t 2:
    # -1 - 0.1 * 0.8 * 2 = -1.16, -1 - 0.1 * 0.2 * 2 = -1.04;
    # O- pool mean -1.1, unbiased sd sqrt(2 * 0.06^2) = 0.0848528
    # A = -+0.06 / (0.0848528 + 1e-4) = -+0.706273; the single O+ token is its pool's mean: 0
    adv, _ = gtpo_advantages(torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[1.0], [1.0], [4.0]]), torch.ones(3, 1))
    assert close(adv, [[0.0], [-0.706274], [0.706274]], 1e-5)  # float32 rounding of -1.16 is ~1e-6


def test_gtpo_passes_flat_rtol_and_names_bad_normalisations():
    # [1, 1.1] with flat_rtol 0.5: spread 0.1 <= 0.5 * 1.1 -> flat: zero advantage, counted
    adv, m = gtpo_advantages(
        torch.tensor([[1.0, 1.1]]), torch.ones(2, 1), torch.ones(2, 1), normalization="joint", flat_rtol=0.5
    )
    assert torch.equal(adv, torch.zeros(2, 1)) and m["num_zero_std_groups"] == 1.0
    with pytest.raises(ValueError, match=re.escape("unknown GTPO normalization 'x'; valid: polarity, joint")):
        gtpo_advantages(torch.ones(1, 2), torch.ones(2, 1), torch.ones(2, 1), normalization="x")


# ---------------------------------------------------------------- GRPO-S


def test_grpo_s_shares_are_per_group_and_unfloored():
    # two groups [1, 0]; entropies 0.5, 4 | 1, 1. Group 1: O+ share 0.5/0.5 = 1, n 1: 1.1;
    # O- 1/H = 0.25, share 0.25/0.25 = 1, m 1: -1.1. Group 2 the same: 1.1, -1.1.
    # (batch-wide sums would give 1.0333 / -1.02, counts over the batch 1.2 / -1.2, floors of 1 1.05 / -1.025)
    shaped = grpo_s_rewards(torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[0.5, 4.0], [1.0, 1.0]]))
    assert close(shaped, [[1.1, -1.1], [1.1, -1.1]], 1e-6)


def test_grpo_s_metrics_and_pass_through():
    # P = 3, G = 2; group 3 flat. shaped 1.1 / -1.1 as above (beta1 1); with beta1 2: 2.1 / -2.1
    R = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    adv, m = grpo_s_advantages(R, torch.ones(3, 2), beta1=2.0)
    assert m["frac_reward_zero_std"] == pytest.approx(1 / 3) and m["num_zero_std_groups"] == 1.0
    assert m["grpo_s/shaped_reward/max"] == pytest.approx(2.1)  # not the flat group's unshaped 1
    assert "advantages/mean" in m and torch.equal(adv[2], torch.zeros(2))
    # flat_rtol 1e-7 makes [1, 1.0000005] a real group (spread 4.8e-7 > 1e-7; the default 1e-6 would call it
    # flat): shaped 1.1 / -1.1 -> unbiased std 1.555635, A = +-1.1 / (1.555635 + 1e-4) = +-0.707062
    adv, _ = grpo_s_advantages(torch.tensor([[1.0000005, 1.0]]), torch.ones(1, 2), flat_rtol=1e-7)
    assert close(adv, [[0.707062, -0.707062]], 2e-6)


def test_grpo_s_counts_flat_groups_by_outcome_not_by_shaped_reward():
    # beta1 = beta2 = 0 shapes [1, 0] to [0, -0]: flat for group_advantages, but the outcomes differ,
    # so the group is not counted as a zero-std group (and its advantage is 0 / (0 + eps) = 0)
    adv, m = grpo_s_advantages(torch.tensor([[1.0, 0.0]]), torch.ones(1, 2), beta1=0.0, beta2=0.0)
    assert m["frac_reward_zero_std"] == 0.0 and m["num_zero_std_groups"] == 0.0
    assert torch.equal(adv.abs(), torch.zeros(1, 2))
