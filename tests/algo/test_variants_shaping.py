"""GTPO and GRPO-S (arXiv 2508.04349): hand-worked shaped rewards and advantages, and properties."""

import pytest
import torch

from grpokit.algo.advantages import group_advantages
from grpokit.algo.entropy_shaping import grpo_s_advantages, grpo_s_rewards, gtpo_advantages, gtpo_token_rewards
from grpokit.config import Config, ConfigError
from grpokit.config.io import apply_overrides
from grpokit.validation import validate

# one group of G = 4 with rewards 1, 1, 0, 0 (O+ = rows 0, 1; O- = rows 2, 3), two tokens each
R = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
H = torch.tensor([[3.0, 1.0], [1.0, 3.0], [2.0, 0.5], [0.5, 0.5]])
M = torch.ones(4, 2)


def close(t, expected, atol):
    return torch.allclose(t.float(), torch.tensor(expected), atol=atol)


def test_gtpo_token_rewards_hand_worked():
    # O+, t=0: H = 3, 1 (sum 4), d_0 = 2: 1 + 0.1 * 3/4 * 2 = 1.15 ; 1 + 0.1 * 1/4 * 2 = 1.05
    # O+, t=1: H = 1, 3: 1.05 ; 1.15
    # O-, t=0: 1/H = 0.5, 2 (sum 2.5), h_0 = 2: -1 - 0.1 * 0.5/2.5 * 2 = -1.04 ; -1 - 0.1 * 2/2.5 * 2 = -1.16
    #          (row 3 is the confident mistake, H = 0.5: the larger penalty)
    # O-, t=1: 1/H = 2, 2: -1 - 0.1 * 1/2 * 2 = -1.1 each
    shaped, pos, valid = gtpo_token_rewards(R, H, M, alpha1=1.0, alpha2=0.1)
    assert close(shaped, [[1.15, 1.05], [1.05, 1.15], [-1.04, -1.1], [-1.16, -1.1]], 1e-6)
    assert pos.tolist() == [True, True, False, False] and bool(valid.all())


def test_gtpo_positions_count_only_running_completions():
    # rewards 1, 1, 0; row 1 has one token: at t=1 only row 0 runs in O+, d_1 = 1 -> 1 + 0.1 * 1 * 1 = 1.1
    # t=0: H 2, 2 -> 1 + 0.1 * 1/2 * 2 = 1.1 each; row 1's padding (t=1) gets 0
    shaped, _, valid = gtpo_token_rewards(
        torch.tensor([[1.0, 1.0, 0.0]]),
        torch.tensor([[2.0, 5.0], [2.0, 9.0], [1.0, 1.0]]),
        torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]),
        alpha1=1.0,
        alpha2=0.1,
    )
    assert close(shaped[:2], [[1.1, 1.1], [1.1, 0.0]], 1e-6)
    assert valid[1].tolist() == [True, False]


def test_gtpo_reward_conservation_proposition_2_2():
    # alpha1 + alpha2 = 1: the O+ rewards of a position add up to d_t, the O- ones to -h_t
    shaped, pos, _ = gtpo_token_rewards(R, H, M, alpha1=0.9, alpha2=0.1)
    assert shaped[pos].sum(dim=0).tolist() == pytest.approx([2.0, 2.0], abs=1e-6)
    assert shaped[~pos].sum(dim=0).tolist() == pytest.approx([-2.0, -2.0], abs=1e-6)


def test_gtpo_polarity_normalisation_eq6_cancels_the_outcome():
    # O+ tokens 1.15, 1.05, 1.05, 1.15: mean 1.1, population std 0.05 -> +1, -1, -1, +1
    # O- tokens -1.04, -1.1, -1.16, -1.1: mean -1.1, population std sqrt(2 * 0.06^2 / 4) = 0.042426
    #   -> +1.41421, 0, -1.41421, 0: the uncertain token of a wrong answer gets a *positive* advantage
    adv, m = gtpo_advantages(R, H, M, std="population", eps=0.0)
    assert close(adv, [[1.0, -1.0], [-1.0, 1.0], [1.41421, 0.0], [-1.41421, 0.0]], 1e-4)
    # eq. 6's consequence: over the O+ tokens the advantages average 0, so alpha1 (the outcome) drops out
    assert adv[:2].mean().item() == pytest.approx(0.0, abs=1e-5)
    assert m["frac_reward_zero_std"] == 0.0


def test_gtpo_joint_normalisation_keeps_the_sign():
    # all 8 shaped tokens: sum 4.4 - 4.4 = 0 -> mean 0; squares 1.3225 1.1025 1.1025 1.3225 1.0816 1.21 1.3456 1.21
    # sum 9.6972, population var 1.21215, std 1.100977 -> 1.15 / 1.100977 = 1.04453, 1.05 -> 0.95370,
    # -1.04 -> -0.94462, -1.16 -> -1.05361, -1.1 -> -0.99911
    adv, _ = gtpo_advantages(R, H, M, normalization="joint", std="population", eps=0.0)
    assert close(adv, [[1.04453, 0.95370], [0.95370, 1.04453], [-0.94462, -0.99911], [-1.05361, -0.99911]], 1e-4)


def test_gtpo_flat_groups_and_pools():
    # a flat group (all wrong) gets zero advantage and stays out of the statistics
    r = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    adv, m = gtpo_advantages(r, torch.cat([H, H]), torch.ones(8, 2), std="population", eps=0.0)
    assert torch.equal(adv[4:], torch.zeros(4, 2)) and m["num_zero_std_groups"] == 1.0
    assert close(adv[:4], [[1.0, -1.0], [-1.0, 1.0], [1.41421, 0.0], [-1.41421, 0.0]], 1e-4)
    # statistics over given pools (another rank's tokens): O+ pool mean 1.0, std 0.1 -> (1.15 - 1) / 0.1 = 1.5
    pools = (torch.tensor([0.9, 1.1]), torch.tensor([-1.0, -1.2]))
    adv_p, _ = gtpo_advantages(R, H, M, std="population", eps=0.0, pools=pools)
    assert adv_p[0, 0].item() == pytest.approx(1.5, abs=1e-4)


def test_grpo_s_hand_worked():
    # mean token entropies 3, 1, 2, 0.5; O+: 1 + 0.1 * 3/4 * 2 = 1.15, 1 + 0.1 * 1/4 * 2 = 1.05
    # O-: 1/H = 0.5, 2 (sum 2.5): -1 - 0.1 * 0.2 * 2 = -1.04 ; -1 - 0.1 * 0.8 * 2 = -1.16
    # group normalisation (population, eps 0): mean 0, var (1.3225 + 1.1025 + 1.0816 + 1.3456)/4 = 1.21305,
    # std 1.101386 -> 1.04414, 0.95334, -0.94426, -1.05322
    Hs = torch.tensor([[3.0, 1.0, 2.0, 0.5]])
    assert close(grpo_s_rewards(R, Hs), [[1.15, 1.05, -1.04, -1.16]], 1e-6)
    adv, _ = grpo_s_advantages(R, Hs, std="population", eps=0.0)
    assert close(adv, [[1.04414, 0.95334, -0.94426, -1.05322]], 1e-4)


def test_grpo_s_without_entropy_weight_is_grpo_and_flat_groups_stay_zero():
    # beta2 = 0: shaped = 1 for correct, -1 for wrong = 2r - 1, an affine map of r, so the group-normalised
    # advantage is GRPO's exactly (eps 0)
    r = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    Hs = torch.tensor([[0.3, 2.0, 1.0, 0.7], [0.3, 2.0, 1.0, 0.7]])
    adv, m = grpo_s_advantages(r, Hs, beta2=0.0, eps=0.0)
    ref, _ = group_advantages(r, eps=0.0)
    assert torch.allclose(adv, ref, atol=1e-6)
    assert torch.equal(adv[1], torch.zeros(4)) and m["num_zero_std_groups"] == 1.0  # flat despite varied entropy


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "algo.advantage=gtp",
            "algo.advantage='gtp' is not valid; choose one of: group, process, gigpo, gagpo, gtpo, grpo_s",
        ),
        ("algo.entropy_shaping=gtpo", "algo.entropy_shaping='gtpo' is no longer a field: algo.advantage alone"),
        (
            "algo.gtpo_normalization=batch",
            "algo.gtpo_normalization='batch' is not valid; choose one of: polarity, joint",
        ),
        ("algo.shaping_entropy_weight=-1", "must be >= 0 (the paper uses 1.0 and 0.1)"),
    ],
)
def test_shaping_config_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(apply_overrides(Config(), [override]))
    # an estimator is one name, so GTPO with GiGPO's credit cannot be asked for; GTPO refuses a scale it would ignore
    with pytest.raises(ConfigError, match="algo.advantage=gtpo normalises its token rewards itself"):
        validate(apply_overrides(Config(), ["algo.advantage=gtpo", "algo.scale=batch"]))
