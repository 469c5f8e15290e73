"""Advantages: hand-worked cases (arithmetic in comments) and properties."""

import math

import pytest
import torch

from grpokit.algo.advantages import ESTIMATORS, flat_groups, group_advantages, process_advantages
from helpers.paths import ROOT


def test_grpo_ten_with_six_correct_population_std():
    # mean = 0.6; population var = 0.6 * 0.4 = 0.24, std = 0.48990
    # correct: (1 - 0.6) / 0.48990 = +0.8165 ; wrong: (0 - 0.6) / 0.48990 = -1.2247
    r = torch.tensor([[1.0] * 6 + [0.0] * 4])
    adv, m = group_advantages(r, std="population", eps=1e-8)
    assert adv[0, :6] == pytest.approx(torch.full((6,), 0.8165), abs=1e-3)
    assert adv[0, 6:] == pytest.approx(torch.full((4,), -1.2247), abs=1e-3)
    assert m["frac_reward_zero_std"] == 0.0


def test_grpo_ten_with_six_correct_unbiased_std():
    # unbiased var = 0.24 * 10/9 = 0.26667, std = 0.51640 -> +0.7746 / -1.1619
    r = torch.tensor([[1.0] * 6 + [0.0] * 4])
    adv, _ = group_advantages(r, std="unbiased", eps=1e-8)
    assert adv[0, 0].item() == pytest.approx(0.7746, abs=1e-3)
    assert adv[0, -1].item() == pytest.approx(-1.1619, abs=1e-3)


def test_mean_centred_only_dr_grpo():
    # rewards 1, 0, 1, 0: mean 0.5 -> +0.5, -0.5, +0.5, -0.5 (no division)
    r = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    adv, _ = group_advantages(r, scale="none")
    assert adv.tolist() == [[0.5, -0.5, 0.5, -0.5]]
    assert ESTIMATORS["dr_grpo"] == ("group_mean", "none")


def test_rloo_leave_one_out():
    # A_0 = 1 - (0 + 1 + 0)/3 = 2/3 ; A_1 = 0 - (1 + 1 + 0)/3 = -2/3
    r = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    adv, _ = group_advantages(r, baseline="leave_one_out", scale="none")
    assert adv[0].tolist() == pytest.approx([2 / 3, -2 / 3, 2 / 3, -2 / 3], abs=1e-6)


def test_batch_std_scale_keeps_group_mean():
    # groups [1, 0] and [3, 1]: group means 0.5 and 2 -> centred +-0.5, +-1
    # batch rewards [1, 0, 3, 1]: mean 1.25, population var (0.0625+1.5625+3.0625+0.0625)/4 = 1.1875
    # std 1.08972 -> 0.5/1.08972 = 0.45883, 1/1.08972 = 0.91766
    r = torch.tensor([[1.0, 0.0], [3.0, 1.0]])
    adv, _ = group_advantages(r, scale="batch", std="population", eps=1e-8)
    assert adv.flatten().tolist() == pytest.approx([0.45883, -0.45883, 0.91766, -0.91766], abs=1e-4)


def test_batch_whiten_whitens_centred_rewards_per_completion():
    # centred [0.5, -0.5, 1, -1]: mean 0, population std sqrt((.25+.25+1+1)/4) = sqrt(0.625) = 0.79057
    # -> 0.63246, -0.63246, 1.26491, -1.26491 (lengths play no part)
    r = torch.tensor([[1.0, 0.0], [3.0, 1.0]])
    adv, _ = group_advantages(r, scale="batch_whiten", std="population", eps=1e-8)
    assert adv.flatten().tolist() == pytest.approx([0.63246, -0.63246, 1.26491, -1.26491], abs=1e-4)


def test_reinforce_pp_baseline_whitens_over_tokens_hand_worked():
    # centred c = [0.5, -0.5, 1, -1] with lengths L = [1, 3, 2, 2] (8 tokens)
    # token mean mu = (0.5*1 - 0.5*3 + 1*2 - 1*2) / 8 = -1/8 = -0.125
    # c - mu = [0.625, -0.375, 1.125, -0.875]; squares .390625, .140625, 1.265625, .765625
    # weighted sum .390625 + 3*.140625 + 2*1.265625 + 2*.765625 = 4.875; unbiased var 4.875 / 7 = 0.696429
    # sqrt 0.834523 -> A = [0.74893, -0.44936, 1.34808, -1.04850] (eps 0)
    r = torch.tensor([[1.0, 0.0], [3.0, 1.0]])
    lengths = torch.tensor([[1, 3], [2, 2]])
    b, s = ESTIMATORS["reinforce_pp_baseline"]
    assert (b, s) == ("group_mean", "token_whiten")
    adv, _ = group_advantages(r, baseline=b, scale=s, eps=0.0, lengths_PG=lengths)
    assert adv.flatten().tolist() == pytest.approx([0.74893, -0.44936, 1.34808, -1.04850], abs=1e-4)
    # a flat group [1, 1] with lengths [1, 5] adds 6 tokens of c = 0 to the statistics (as in verl):
    # mu = -1/14 = -0.0714286; sum L (c - mu)^2 = sum L c^2 - n mu^2 = 5 - 14/196 = 4.928571;
    # var = 4.928571 / 13 = 0.379121, sqrt 0.615728; the first completion: (0.5 + 0.0714286) / 0.615728 = 0.92805
    r3 = torch.tensor([[1.0, 0.0], [3.0, 1.0], [1.0, 1.0]])
    adv3, m = group_advantages(r3, scale="token_whiten", eps=0.0, lengths_PG=torch.tensor([[1, 3], [2, 2], [1, 5]]))
    assert adv3[0, 0].item() == pytest.approx(0.92805, abs=1e-4)
    assert torch.equal(adv3[2], torch.zeros(2)) and m["num_zero_std_groups"] == 1  # grpokit's flat-group rule


def test_token_whiten_at_equal_lengths_differs_from_batch_whiten_by_the_divisors():
    # equal lengths L: mu = 0 in both, var_tok = L sum c^2 / (N L - 1), var_seq = sum c^2 / (N - 1), so
    # A_tok / A_seq = sqrt((N L - 1) / (L (N - 1))): N = 12, L = 50 -> sqrt(599 / 550) = 1.04360 (about 4%)
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0, 0.0], [0.2, 0.9, 0.4, 0.0, 0.7, 0.5]])
    tok, _ = group_advantages(r, scale="token_whiten", eps=0.0, lengths_PG=torch.full((2, 6), 50))
    seq, _ = group_advantages(r, scale="batch_whiten", eps=0.0)
    assert torch.allclose(tok / seq, torch.full((2, 6), math.sqrt(599 / 550)), atol=1e-5)


def test_token_whiten_needs_lengths():
    with pytest.raises(ValueError, match="pass lengths_PG"):
        group_advantages(torch.tensor([[1.0, 0.0]]), scale="token_whiten")
    with pytest.raises(ValueError, match="shaped like the rewards"):
        group_advantages(torch.tensor([[1.0, 0.0]]), scale="token_whiten", lengths_PG=torch.tensor([3, 4]))


def test_worked_example_in_the_docs_at_the_default_eps_and_at_eps_0():
    # ten completions, six correct: mean 0.6, unbiased std sqrt(0.24 * 10/9) = 0.516398
    # defaults (unbiased, eps 1e-4): +0.4 / 0.516498 = +0.7744, -0.6 / 0.516498 = -1.1617
    # eps 0: +0.4 / 0.516398 = +0.7746, -1.1619; population std sqrt(0.24) = 0.489898, eps 0: +0.8165, -1.2247
    r = torch.tensor([[1.0] * 6 + [0.0] * 4])
    cases = {
        "default": ({}, 0.7744, -1.1617),
        "eps0": ({"eps": 0.0}, 0.7746, -1.1619),
        "population": ({"eps": 0.0, "std": "population"}, 0.8165, -1.2247),
    }
    doc = (ROOT / "docs" / "ALGORITHMS.md").read_text().replace("\u2212", "-")
    for kw, good, bad in cases.values():
        adv, _ = group_advantages(r, **kw)
        assert adv[0, 0].item() == pytest.approx(good, abs=5e-5) and adv[0, -1].item() == pytest.approx(bad, abs=5e-5)
        assert f"+{good:.4f}" in doc and f"{bad:.4f}" in doc  # the docs quote these numbers


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_equal_rewards_give_exact_zero_and_are_counted(estimator):
    b, s = ESTIMATORS[estimator]
    r = torch.tensor([[0.7, 0.7, 0.7], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    adv, m = group_advantages(r, baseline=b, scale=s, lengths_PG=torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]]))
    assert torch.equal(adv[0], torch.zeros(3)) and torch.equal(adv[2], torch.zeros(3))
    assert adv[1].abs().sum() > 0
    assert m["num_zero_std_groups"] == 2 and m["frac_reward_zero_std"] == pytest.approx(2 / 3)


def test_floating_point_noise_does_not_explode():
    # 0.1 + 0.2 != 0.3 in floating point; a std of ~1e-17 must not turn that into +-1e16 advantages
    noisy = torch.tensor([[0.1 + 0.2, 0.3, 0.3, 0.3]], dtype=torch.float64)
    assert noisy[0, 0] != noisy[0, 1]
    adv, m = group_advantages(noisy)
    assert torch.equal(adv, torch.zeros(1, 4)) and m["num_zero_std_groups"] == 1
    # but a real, small difference is signal
    assert not flat_groups(torch.tensor([[0.3, 0.3001]]))[0]


def test_small_rewards_are_not_flat():
    # a reward scaled small, 1e-4 * {0, 1}: spread 1e-4. The old rule (absolute 1e-6 below 1) kept it
    # as signal only by luck of the scale; 1e-7 * {0, 1} (spread 1e-7 > TRL's 1e-8) was zeroed.
    # Relative rule: 1e-7 > max(1e-6 * 1e-7, 1e-8) = 1e-8, so not flat. GRPO on [0, 1e-7]: mean 5e-8,
    # unbiased std 7.07e-8, advantages (0 - 5e-8) / (7.07e-8 + eps) ~ -5e-8 / 1e-4 (eps dominates) -> the
    # sign survives: adv[0] < 0 < adv[1].
    r = torch.tensor([[0.0, 1e-7], [0.0, 1e-4]])
    assert not flat_groups(r).any()
    adv, m = group_advantages(r)
    assert m["num_zero_std_groups"] == 0
    assert adv[0, 0] < 0 < adv[0, 1] and adv[1, 0] < 0 < adv[1, 1]
    # below TRL's floor it is flat: spread 1e-9 <= 1e-8
    assert flat_groups(torch.tensor([[0.0, 1e-9]]))[0]
    # relative at any scale: 1e6 * {1, 1 + 1e-7} has spread 0.1 <= 1e-6 * 1e6 = 1, flat (float64)
    assert flat_groups(torch.tensor([[1e6, 1e6 + 0.1]], dtype=torch.float64))[0]


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages(torch.ones(3, 1))
    with pytest.raises(ValueError, match="valid: group, batch, none"):
        group_advantages(torch.ones(3, 2), scale="max")


def test_process_supervision_hand_worked():
    # group of 2: completion 0 has steps ending at tokens 1 and 3 with rewards 1.0 and 0.0;
    # completion 1 has one step ending at token 2 with reward 0.2.
    # all step rewards [1, 0, 0.2]: mean 0.4, population var (0.36 + 0.16 + 0.04)/3 = 0.186667,
    # std 0.432049 -> normalised [1.38873, -0.92582, -0.46291]
    # completion 0: t=0,1 see both steps: 1.38873 - 0.92582 = 0.46291; t=2,3 only the second: -0.92582
    # completion 1: t=0..2 see its step: -0.46291; t=3 sees none: 0
    rewards = torch.tensor([[1.0, 0.0], [0.2, 0.0]])
    ends = torch.tensor([[1, 3], [2, 0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    adv, m = process_advantages(rewards, ends, mask, group_size=2, num_tokens=4, std="population", eps=1e-8)
    expected = [[0.46291, 0.46291, -0.92582, -0.92582], [-0.46291, -0.46291, -0.46291, 0.0]]
    assert adv.tolist()[0] == pytest.approx(expected[0], abs=1e-4)
    assert adv.tolist()[1] == pytest.approx(expected[1], abs=1e-4)
    assert m["frac_reward_zero_std"] == 0.0


def test_process_statistics_are_those_of_the_token_advantages_trained():
    # G = 2; completion 0 (4 tokens) has steps (end 1, r 1), (end 3, r 0); completion 1 (6 tokens) (2, 0), (4, 1),
    # (5, 1). Pooled [1, 0, 0, 1, 1]: mean 0.6, Bessel std sqrt(1.2 / 4) = 0.547723; with eps 1e-4
    # z(1) = 0.4 / 0.547823 = 0.730163, z(0) = -0.6 / 0.547823 = -1.095244.
    # tokens of 0: t0-1 z(1) + z(0) = -0.365081, t2-3 z(0) = -1.095244 (t4-5 padding, out of the mask);
    # tokens of 1: t0-2 z(0) + 2 z(1) = 0.365081, t3-4 2 z(1) = 1.460325, t5 z(1) = 0.730163.
    # Over the 10 real tokens: max 1.460325 (before: 0.730163, the largest normalised step reward, which no token
    # trains with here), min -1.095244, mean (2 (-0.365081) + 2 (-1.095244) + 3 (0.365081) + 2 (1.460325)
    # + 0.730163) / 10 = 0.182541
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    ends = torch.tensor([[1, 3, 0], [2, 4, 5]])
    steps = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    tokens = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    adv, m = process_advantages(rewards, ends, steps, 2, 6, token_mask_NT=tokens)
    assert (adv * tokens).tolist()[1] == pytest.approx(
        [0.365081, 0.365081, 0.365081, 1.460325, 1.460325, 0.730163], abs=1e-5
    )
    assert (m["advantages/max"], m["advantages/min"]) == pytest.approx((1.460325, -1.095244), abs=1e-5)
    assert m["advantages/mean"] == pytest.approx(0.182541, abs=1e-5)


def test_process_supervision_flat_group_is_zero():
    rewards = torch.tensor([[0.5, 0.5], [0.5, 0.0]])
    ends = torch.tensor([[0, 2], [1, 0]])
    mask = torch.tensor([[1, 1], [1, 0]])  # padding step (reward 0) must not break flatness
    adv, m = process_advantages(rewards, ends, mask, group_size=2, num_tokens=3)
    assert torch.equal(adv, torch.zeros(2, 3)) and m["num_zero_std_groups"] == 1


def test_process_single_final_step_matches_outcome_advantage():
    # one step per completion ending at its last token == outcome supervision on every token
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    T = 5
    adv_ps, _ = process_advantages(r[:, None], torch.full((4, 1), T - 1), torch.ones(4, 1), group_size=4, num_tokens=T)
    adv_os, _ = group_advantages(r.view(1, 4))
    assert torch.allclose(adv_ps, adv_os.view(4, 1).expand(4, T), atol=1e-6)
    assert not math.isnan(adv_ps.sum().item())
