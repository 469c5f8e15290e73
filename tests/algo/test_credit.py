"""Step-level credit across the turns of episodes: GiGPO, GAGPO and the turn-level ratio, on
examples worked out by hand in the comments."""

import math

import pytest
import torch

from grpokit.algo.advantages import group_advantages
from grpokit.algo.credit import discounted_returns, gagpo_advantages, gigpo_advantages, steps_to_tokens
from grpokit.algo.ratio import log_importance_ratio

# One prompt, G = 3 episodes, gamma = 0.5. Episode 0: states (A, B), reward 1 at its end; episode 1:
# states (A, B), reward 0; episode 2: one step from A, reward 0.
REWARDS_NS = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
STATES_NS = torch.tensor([[0, 1], [0, 1], [0, 0]])
MASK_NS = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])


def test_discounted_returns_by_hand():
    # R_t = r_t + 0.5 R_{t+1}: episode 0 -> [0 + 0.5 * 1, 1] = [0.5, 1]
    R = discounted_returns(REWARDS_NS, MASK_NS, 0.5)
    assert torch.allclose(R, torch.tensor([[0.5, 1.0], [0.0, 0.0], [0.0, 0.0]]))


def test_gigpo_worked_example():
    # Episode level: rewards [1, 0, 0], mean 1/3, unbiased std sqrt(1/3) = 0.57735
    #   A_E = [2/3, -1/3, -1/3] / 0.57735 = [1.1547, -0.57735, -0.57735]
    # Step level, state A: returns [0.5, 0, 0], mean 1/6, unbiased std sqrt(1/12) = 0.288675
    #   A_S = [1/3, -1/6, -1/6] / 0.288675 = [1.1547, -0.57735, -0.57735]
    # state B: returns [1, 0], mean 0.5, std sqrt(0.5) = 0.70711 -> A_S = [0.70711, -0.70711]
    # A = A_E + 1.0 * A_S
    adv, m = gigpo_advantages(torch.tensor([[1.0, 0.0, 0.0]]), REWARDS_NS, STATES_NS, MASK_NS, gamma=0.5, eps=0.0)
    a, s = 2 / 3 / math.sqrt(1 / 3), 1 / math.sqrt(2)
    expected = torch.tensor([[a + a, a + s], [-a / 2 - a / 2, -a / 2 - s], [-a / 2 - a / 2, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5), adv
    assert m["gigpo/singleton_step_fraction"] == 0.0 and m["gigpo/step_group_size_mean"] == pytest.approx(13 / 5)


def test_gigpo_singleton_state_gets_no_step_advantage_and_weight_zero_is_grpo():
    # Episode 2's step 0 acts from a state nobody else saw (id 7): its A_S is 0, so its advantage is A_E.
    states = torch.tensor([[0, 1], [0, 1], [7, 0]])
    adv, _ = gigpo_advantages(torch.tensor([[1.0, 0.0, 0.0]]), REWARDS_NS, states, MASK_NS, gamma=0.5, eps=0.0)
    A_E, _ = group_advantages(torch.tensor([[1.0, 0.0, 0.0]]), eps=0.0)
    assert adv[2, 0].item() == pytest.approx(A_E[0, 2].item())
    adv0, _ = gigpo_advantages(
        torch.tensor([[1.0, 0.0, 0.0]]), REWARDS_NS, STATES_NS, MASK_NS, step_weight=0.0, eps=0.0
    )
    assert torch.allclose(adv0, A_E[0][:, None] * MASK_NS)


def test_gagpo_lambda_one_telescopes_to_return_minus_grouped_value():
    # V(A) = mean of returns from A = (0.5 + 0 + 0) / 3 = 1/6, V(B) = (1 + 0) / 2 = 1/2
    # lambda = 1: A_t = R_t - V(s_t) = [1/3, 1/2], [-1/6, -1/2], [-1/6]
    # (check the TD form on episode 0: d0 = 0 + 0.5 V(B) - V(A) = 1/12, d1 = 1 - 1/2; A0 = 1/12 + 0.5 * 1/2 = 1/3)
    # group-normalised over the 5 steps: mean 0, unbiased std sqrt((4+9+1+9+1)/36 / 4) = sqrt(1/6)
    adv, m = gagpo_advantages(REWARDS_NS, STATES_NS, MASK_NS, 3, gamma=0.5, lam=1.0, eps=0.0)
    sd = math.sqrt(1 / 6)
    expected = torch.tensor([[1 / 3, 1 / 2], [-1 / 6, -1 / 2], [-1 / 6, 0.0]]) / sd
    assert torch.allclose(adv, expected * MASK_NS, atol=1e-5), adv
    assert m["gagpo/value_proxy/max"] == pytest.approx(0.5)


def test_gagpo_lambda_half_by_hand():
    # deltas: ep0 [1/12, 1/2]; ep1 [0 + 0.5 * 1/2 - 1/6 = 1/12, -1/2]; ep2 [0 + 0 - 1/6] (no next step)
    # GAE with gamma * lambda = 0.25: ep0 A0 = 1/12 + 0.25 * 1/2 = 5/24; ep1 A0 = 1/12 - 0.25 * 1/2 = -1/24
    # values [5, 12, -1, -12, -4] / 24, mean 0, unbiased var (25 + 144 + 1 + 144 + 16) / 576 / 4
    adv, _ = gagpo_advantages(REWARDS_NS, STATES_NS, MASK_NS, 3, gamma=0.5, lam=0.5, eps=0.0)
    sd = math.sqrt(330 / 576 / 4)
    expected = torch.tensor([[5 / 24, 12 / 24], [-1 / 24, -12 / 24], [-4 / 24, 0.0]]) / sd
    assert torch.allclose(adv, expected * MASK_NS, atol=1e-5), adv


def test_single_turn_gagpo_is_grpo():
    # One step per episode from one shared state: V = group mean, A = r - mean, normalised by the
    # group std: exactly GRPO's advantage.
    r = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.2, 0.2, 0.9, 0.1]])
    adv, _ = gagpo_advantages(
        r.reshape(-1, 1), torch.zeros(8, 1, dtype=torch.long), torch.ones(8, 1), 4, gamma=0.9, lam=0.7
    )
    grpo, _ = group_advantages(r)
    assert torch.allclose(adv.reshape(2, 4), grpo, atol=1e-6)


def test_flat_group_gets_zero_step_advantages():
    r = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    adv, m = gagpo_advantages(r, torch.tensor([[0, 1], [0, 1]]), torch.ones(2, 2), 2, gamma=1.0, lam=1.0)
    assert torch.equal(adv, torch.zeros(2, 2)) and m["frac_reward_zero_std"] == 1.0
    adv, _ = gigpo_advantages(torch.tensor([[1.0, 1.0]]), r, torch.tensor([[0, 1], [0, 1]]), torch.ones(2, 2))
    assert torch.equal(adv, torch.zeros(2, 2))


def test_steps_to_tokens_and_turn_ratio_by_hand():
    # tokens: turn 0 (2 model tokens), 1 environment token, turn 1 (1 model token)
    turn_ids = torch.tensor([[0, 0, 0, 1]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    assert torch.equal(
        steps_to_tokens(torch.tensor([[2.0, -1.0]]), turn_ids, mask), torch.tensor([[2.0, 2.0, 0.0, -1.0]])
    )
    # log-ratios [0.2, 0.4, (env) 5.0, 0.6]: turn 0 mean over its model tokens = 0.3, turn 1 = 0.6
    logp = torch.tensor([[0.2, 0.4, 5.0, 0.6]], requires_grad=True)
    lr = log_importance_ratio(logp, torch.zeros(1, 4), mask, "turn", turn_ids)
    assert torch.allclose(lr.detach(), torch.tensor([[0.3, 0.3, 0.3, 0.6]]))
    (lr * mask).sum().backward()  # GSPO-token form: the gradient reaches each token's own logprob
    assert torch.equal(logp.grad, mask[0][None])
    with pytest.raises(ValueError, match="turn_ids_NT"):
        log_importance_ratio(logp, torch.zeros(1, 4), mask, "turn")
