"""The distinguishing math of each variant on hand-made batches."""

import pytest
import torch

from grpokit.algo.advantages import kl_penalized_rewards, normalize_components
from grpokit.algo.loss import offpolicy_sequences, policy_loss
from grpokit.algo.masks import entropy_token_mask


def test_offpolicy_masking_deepseek_v32():
    # seq 0: A=-1, mean(old - logp) = 0.5 > 0.1 -> masked
    # seq 1: A=+1, drift 0.5 but positive advantage -> kept
    # seq 2: A=-1, drift 0.05 <= 0.1 -> kept
    logp = torch.zeros(3, 2)
    old = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.05, 0.05]])
    adv = torch.tensor([-1.0, 1.0, -1.0])[:, None].expand(3, 2)
    drop = offpolicy_sequences(logp, old, adv, torch.ones(3, 2), 0.1)
    assert drop.tolist() == [True, False, False]
    # in the loss the masked sequence gets no gradient, the others do
    x = logp.clone().requires_grad_(True)
    loss, m = policy_loss(
        x, old, torch.tensor([-1.0, 1.0, -1.0]), torch.ones(3, 2), offpolicy_delta=0.1, clip_low=0.9, clip_high=5.0
    )
    loss.backward()
    assert torch.equal(x.grad[0], torch.zeros(2)) and x.grad[1].abs().sum() > 0 and x.grad[2].abs().sum() > 0
    assert m["offpolicy/masked_sequences"] == 1.0


def test_offpolicy_masking_reads_a_nan_log_ratio_as_no_drift_and_ignores_padding():
    # seq 0: drifts (1.0 - 0) and (nan -> 0): mean 0.5 > 0.1 -> masked (a NaN poisoned the sum before: kept)
    # seq 1: a NaN on a padded position only: drift 0.0 (its one real token) -> kept
    logp = torch.zeros(2, 2)
    old = torch.tensor([[1.0, float("nan")], [0.0, float("nan")]])
    adv = torch.full((2, 2), -1.0)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert offpolicy_sequences(logp, old, adv, mask, 0.1).tolist() == [True, False]
    old[1, 0] = 0.3  # 0.3 > 0.1 on its real token: the padded NaN does not hide it
    assert offpolicy_sequences(logp, old, adv, mask, 0.1).tolist() == [True, True]


def test_entropy_token_mask_keeps_top_fraction_of_real_tokens():
    # real entropies 0.1 0.5 0.9 | 0.3 0.7 (the 5.0 is padding and must not count)
    # sorted [0.1, 0.3, 0.5, 0.7, 0.9]; the 0.6 quantile sits at index 2.4 -> 0.5 + 0.4 * 0.2 = 0.58
    # -> keep 0.9 and 0.7: the top 40%
    ent = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    kept = entropy_token_mask(ent, mask, 0.4)
    assert kept.tolist() == [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    assert torch.equal(entropy_token_mask(ent, mask, 1.0), mask)


def test_entropy_bonus_gradient():
    # loss = -(ratio * A) - coef * H per token, token-mean over 2 tokens: dL/dH = -coef / 2
    logp = torch.zeros(1, 2)
    ent = torch.tensor([[1.0, 2.0]], requires_grad=True)
    loss, _ = policy_loss(
        logp, logp, torch.zeros(1), torch.ones(1, 2), entropy_NT=ent, entropy_coef=0.01, aggregation="token-mean"
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.01 * 1.5)
    assert ent.grad[0].tolist() == pytest.approx([-0.005, -0.005])


def test_multi_objective_normalisation_is_scale_free():
    # one group of 2; component 1 rewards [1, 0], component 2 rewards [10, 0] (ten times larger)
    # each normalised in its group: unbiased std of [a, 0] = a/sqrt(2) -> (a/2)/(a/sqrt(2)) = +-0.70711
    # weighted sum with weights [1, 1]: +-1.41421 -- both components count equally despite the scale
    r = torch.tensor([[[1.0, 10.0], [0.0, 0.0]]])  # (P=1, G=2, F=2)
    out = normalize_components(r, torch.tensor([1.0, 1.0]), eps=0.0)
    assert out.flatten().tolist() == pytest.approx([1.41421, -1.41421], abs=1e-4)
    # a flat component contributes nothing; a NaN (not applicable) entry is left out
    r2 = torch.tensor([[[1.0, 3.0], [0.0, 3.0], [float("nan"), 3.0]]])
    out2 = normalize_components(r2, torch.tensor([1.0, 2.0]), eps=0.0)
    assert out2.flatten().tolist() == pytest.approx([0.70711, -0.70711, 0.0], abs=1e-4)


def test_kl_in_the_reward():
    # k1 per token: seq 0 [0.1, 0.2] -> 0.3 ; seq 1 [0.3, (pad 9)] -> 0.3; beta 0.5 -> rewards 1 - 0.15, 0 - 0.15
    logp = torch.tensor([[0.1, 0.2], [0.3, 9.0]])
    ref = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    r, kl = kl_penalized_rewards(torch.tensor([1.0, 0.0]), logp, ref, mask, 0.5)
    assert r.tolist() == pytest.approx([0.85, -0.15]) and kl.tolist() == pytest.approx([0.3, 0.3])
