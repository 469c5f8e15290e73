"""Hand-worked cases for step-level credit (GiGPO, GAGPO) and the train/sampler mismatch (IcePop, MIS)
that kill mutants other tests let survive (``make mutate``, docs/MUTATION.md): defaults as shipped,
keywords passed through, boundaries, empty inputs and metric names.
"""

import math
import re

import pytest
import torch

from grpokit.algo.credit import _state_group_stats, gagpo_advantages, gigpo_advantages, steps_to_tokens
from grpokit.algo.tis import mismatch_mask, mismatch_metrics, mismatch_sums


def close(a, b, tol):
    return torch.allclose(a.float(), torch.tensor(b, dtype=torch.float32), atol=tol, rtol=0)


# ---------------------------------------------------------------- state groups


def test_state_group_stats_population_std_and_flat_at_zero_tolerance():
    # one prompt of 4 episodes, one step each: state 0 holds values 0, 2 (mean 1, population std 1, not flat);
    # state 1 holds 5, 5 (std 0, flat even with flat_rtol 0 since 0 <= 0)
    mean, sd, count, flat = _state_group_stats(
        torch.tensor([[0.0], [2.0], [5.0], [5.0]]),
        torch.tensor([[0], [0], [1], [1]]),
        torch.ones(4, 1),
        4,
        "population",
        0.0,
    )
    assert mean.flatten().tolist() == [1.0, 1.0, 5.0, 5.0] and sd.flatten().tolist() == [1.0, 1.0, 0.0, 0.0]
    assert count.flatten().tolist() == [2.0] * 4 and flat.flatten().tolist() == [False, False, True, True]


def test_state_group_stats_single_steps_relative_tolerance_and_empty():
    # a state alone: its mean is its value (count 1 is not floored to 2)
    mean, _, count, _ = _state_group_stats(
        torch.tensor([[3.0]]), torch.tensor([[0]]), torch.ones(1, 1), 1, "unbiased", 1e-6
    )
    assert mean.item() == 3.0 and count.item() == 1.0
    # [10, 10.5] with flat_rtol 0.1: spread 0.5 <= 0.1 * 10.5 -> flat (the tolerance scales with the values)
    two = torch.tensor([[0], [0]])
    assert _state_group_stats(torch.tensor([[10.0], [10.5]]), two, torch.ones(2, 1), 2, "unbiased", 0.1)[3].all()
    # [0, 0.15] with flat_rtol 0.1: the scale is floored at 1, spread 0.15 > 0.1 -> not flat
    assert not _state_group_stats(torch.tensor([[0.0], [0.15]]), two, torch.ones(2, 1), 2, "unbiased", 0.1)[3].any()
    # no real step at all: zeros, no error
    out = _state_group_stats(torch.ones(2, 1), two, torch.zeros(2, 1), 2, "unbiased", 1e-6)
    assert all(not x.any() for x in out)


# ---------------------------------------------------------------- GiGPO

# one group of 2 two-step episodes; episode rewards [1, 0]; step rewards [0, 1] and [0, 0]; both episodes
# start in state 0, then reach different states (1, 2): step groups {ep0 t0, ep1 t0} and two singletons.
# Default gamma 0.95: returns ep0 [0.95, 1], ep1 [0, 0]; step group of t0: values [0.95, 0], mean 0.475.
EP_R, STEP_R = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0], [0.0, 0.0]])
STATES, STEP_M = torch.tensor([[0, 1], [0, 2]]), torch.ones(2, 2)


def test_gigpo_scale_none_default_gamma_and_metrics():
    # scale none: A_E = r - mean = +-0.5; A_S(t0) = +-0.475 unscaled (a gamma of 1.95 would give +-0.975);
    # singletons get 0: ep0 [0.5 + 0.475, 0.5], ep1 [-0.975, -0.5]
    adv, m = gigpo_advantages(EP_R, STEP_R, STATES, STEP_M, scale="none")
    assert close(adv, [[0.975, 0.5], [-0.975, -0.5]], 1e-6)
    assert m["gigpo/step_group_size_mean"] == 1.5  # step-group sizes 2, 1, 2, 1
    assert m["gigpo/singleton_step_fraction"] == 0.5
    assert m["gigpo/step_advantages/max"] == pytest.approx(0.475)


def test_gigpo_default_eps_and_std_reach_both_levels():
    # std population, default eps 1e-4: A_E = +-0.5 / (0.5 + 1e-4) = +-0.999800;
    # A_S(t0) = +-0.475 / (0.475 + 1e-4) = +-0.999789 -> ep0 [1.999589, 0.999800], ep1 the negatives
    adv, _ = gigpo_advantages(EP_R, STEP_R, STATES, STEP_M, std="population")
    a_e, a_s = 0.5 / 0.5001, 0.475 / 0.4751
    assert close(adv, [[a_e + a_s, a_e], [-a_e - a_s, -a_e]], 1e-5)


def test_gigpo_passes_flat_rtol_and_handles_no_real_step():
    # episode rewards [1, 1.1] with flat_rtol 0.5 are flat: A_E = 0; no step reward, all states distinct: A_S = 0
    adv, m = gigpo_advantages(
        torch.tensor([[1.0, 1.1]]), torch.zeros(2, 2), torch.tensor([[0, 1], [2, 3]]), STEP_M, flat_rtol=0.5
    )
    assert torch.equal(adv, torch.zeros(2, 2)) and m["num_zero_std_groups"] == 1.0
    _, m = gigpo_advantages(EP_R, STEP_R, STATES, torch.zeros(2, 2))
    assert m["gigpo/step_group_size_mean"] == 0.0 and m["gigpo/singleton_step_fraction"] == 0.0


# ---------------------------------------------------------------- GAGPO


def test_gagpo_defaults_hand_worked():
    # group 1 as above but both episodes share state 1 at t1 (states [0, 1] and [0, 1]); group 2 all zero.
    # Returns ep0 [0.95, 1], ep1 [0, 0]; V(t0 state) = 0.475, V(t1 state) = 0.5.
    # TD: ep0 t1 1 - 0.5 = 0.5, t0 0 + 0.95 * 0.5 - 0.475 = 0; ep1 t1 -0.5, t0 0.475 - 0.475 = 0.
    # GAE (gamma lam = 0.9025): A ep0 [0.9025 * 0.5, 0.5] = [0.45125, 0.5], ep1 the negatives.
    # group std over 4 steps (mean 0, unbiased): sqrt(2 (0.45125^2 + 0.25) / 3) = 0.549925; eps 1e-4:
    # 0.45125 / 0.550025 = 0.820417, 0.5 / 0.550025 = 0.909050. Group 2: flat -> 0.
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    states = torch.tensor([[0, 1], [0, 1], [0, 1], [0, 1]])
    adv, m = gagpo_advantages(r, states, torch.ones(4, 2), 2)
    assert close(adv, [[0.820417, 0.909050], [-0.820417, -0.909050], [0.0, 0.0], [0.0, 0.0]], 2e-6)
    assert m["frac_reward_zero_std"] == 0.5 and m["num_zero_std_groups"] == 1.0
    assert m["advantages/max"] == pytest.approx(0.909050, abs=2e-6)


def test_gagpo_names_a_batch_that_does_not_split_into_groups():
    with pytest.raises(ValueError, match=re.escape("3 episodes do not split into groups of 2")):
        gagpo_advantages(torch.zeros(3, 1), torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1), 2)


def test_steps_to_tokens_clamps_turn_ids_into_range():
    # turn ids -1 (padding) and 5 (past the last step) read steps 0 and 1
    out = steps_to_tokens(torch.tensor([[1.0, 2.0]]), torch.tensor([[-1, 0, 1, 5]]), torch.ones(1, 4))
    assert out.tolist() == [[1.0, 1.0, 2.0, 2.0]]


# ---------------------------------------------------------------- mismatch


def test_mismatch_sums_bounds_are_inclusive_and_empty_is_zero():
    # equal log-probs: r = 1 exactly, inside [1, 1]
    s = mismatch_sums(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 1.0, 1.0)
    assert s["outside"] == 0.0 and s["tokens"] == 2.0
    assert mismatch_sums(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), 0.5, 2.0)["abs_diff_max"] == 0.0


def test_mismatch_metrics_means_over_tokens_and_defaults():
    m = mismatch_metrics({"tokens": 1.0, "abs_diff": 0.5, "abs_diff_max": 0.5, "k3": 0.1, "outside": 1.0})
    assert m == {
        "mismatch/logp_abs_diff_mean": 0.5,
        "mismatch/logp_abs_diff_max": 0.5,
        "mismatch/k3_kl": 0.1,
        "mismatch/outside_fraction": 1.0,
    }
    assert set(mismatch_metrics({}).values()) == {0.0}  # nothing measured yet: zeros, not an error


def test_mismatch_mask_modes_boundaries_and_counts():
    with pytest.raises(ValueError, match=re.escape("mismatch mask mode must be none, token or sequence, got 'x'")):
        mismatch_mask(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), "x", 0.5, 2.0)
    z, one = torch.zeros(1, 2), torch.ones(1, 2)
    for mode in ("token", "sequence"):  # r = 1 on the bounds [1, 1] stays
        keep, m = mismatch_mask(z, z, one, mode, 1.0, 1.0)
        assert keep.tolist() == [[1.0, 1.0]] and m["mismatch/masked_fraction"] == 0.0
    # sequence mode: row 0 one real token with log r = log 3 -> geometric mean 3, outside [0.5, 2.5], dropped
    # (dividing by 2 tokens would give sqrt 3 = 1.73, inside); row 1 log r = [log 4, 0] -> mean r 2, kept
    # (dividing by the batch's 3 tokens would keep row 0: 3^(1/3) = 1.44). Dropped: 1 of 3 real tokens.
    old = torch.tensor([[math.log(3.0), 0.0], [math.log(4.0), 0.0]])
    keep, m = mismatch_mask(old, torch.zeros(2, 2), torch.tensor([[1.0, 0.0], [1.0, 1.0]]), "sequence", 0.5, 2.5)
    assert keep.tolist() == [[0.0, 1.0], [1.0, 1.0]] and m["mismatch/masked_fraction"] == pytest.approx(1 / 3)
    # one real token, dropped: fraction 1 (not 1/2); keep takes the log-probs' float dtype, float32 for others
    keep, m = mismatch_mask(
        torch.tensor([[3.0]], dtype=torch.float64), torch.zeros(1, 1), torch.ones(1, 1), "token", 0.5, 2.0
    )
    assert m["mismatch/masked_fraction"] == 1.0 and keep.dtype == torch.float64
    keep, _ = mismatch_mask(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1), torch.ones(1, 1), "none", 0.5, 2.0)
    assert keep.dtype == torch.float32
