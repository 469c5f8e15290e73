"""Unscorable completions: every reward function returned None, so the completion has no reward. Every
estimator leaves it out of its statistics and gives it advantage 0 (TRL 1.16's rule); the pipeline marks it
NaN (ScoredBatch.scored_N). Hand-worked cases, and the property that defines "left out": the other
completions get exactly the advantages they would get if the unscorable one had never been sampled."""

import math

import pytest
import torch

from grpokit.algo import registry
from grpokit.algo.advantages import BASELINES, group_advantages
from grpokit.algo.credit import gagpo_advantages, gigpo_advantages
from grpokit.algo.entropy_shaping import grpo_s_advantages, gtpo_advantages
from grpokit.algo.pipeline import LogProbs
from grpokit.config.sections import AlgoConfig
from helpers.pipeline_batches import run, scored

NAN = float("nan")


def test_group_std_by_hand():
    # [1, 1, None, 0]: mean 2/3 and Bessel std sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = sqrt(1/3) = 0.57735 over the
    # three scored; (1 - 2/3) / 0.57745 = 0.57725, (0 - 2/3) / 0.57745 = -1.15450 (TRL's numbers); a 0 in the
    # statistics would give [0.866, 0.866, -0.866, -0.866] instead
    adv, m = group_advantages(torch.tensor([[1.0, 1.0, NAN, 0.0]]))
    assert adv.tolist()[0] == pytest.approx([0.57725, 0.57725, 0.0, -1.15450], abs=1e-5)
    assert m["advantages/min"] == pytest.approx(-1.15450, abs=1e-5)  # statistics of the scored ones only


def test_rloo_by_hand():
    # leave-one-out over the scored: 1 - mean(1, 0) = 0.5; 0 - mean(1, 1) = -1; = 3/2 (r - 2/3)
    adv, _ = group_advantages(torch.tensor([[1.0, 1.0, NAN, 0.0]]), baseline="leave_one_out", scale="none")
    assert adv.tolist()[0] == pytest.approx([0.5, 0.5, 0.0, -1.0])


def test_batch_std_by_hand():
    # group 0 has one scored completion: flat, 0. Group 1 [0, 2]: centred [-1, 1]. The batch std is over the
    # three scored rewards {1, 0, 2}: mean 1, Bessel variance (0 + 1 + 1) / 2 = 1 -> [-1, 1] / (1 + 1e-4)
    adv, m = group_advantages(torch.tensor([[1.0, NAN], [0.0, 2.0]]), scale="batch")
    assert adv.flatten().tolist() == pytest.approx([0.0, 0.0, -0.9999, 0.9999], abs=1e-4)
    assert m["num_zero_std_groups"] == 1.0


def test_token_whiten_by_hand():
    # REINFORCE++-baseline: centred over the scored [1, 0] -> [0.5, -0.5]; lengths [2, 1] (the unscorable
    # row's 5 tokens weigh nothing): mu = (2 * 0.5 - 0.5) / 3 = 1/6, var = (2 (1/3)^2 + (2/3)^2) / (3 - 1) = 1/3
    # -> (1/3) / sqrt(1/3) = 0.57735 and (-2/3) / sqrt(1/3) = -1.15470
    lengths = torch.tensor([[2.0, 1.0, 5.0]])
    adv, _ = group_advantages(torch.tensor([[1.0, 0.0, NAN]]), scale="token_whiten", eps=0.0, lengths_PG=lengths)
    assert adv.tolist()[0] == pytest.approx([1 / math.sqrt(3), -2 / math.sqrt(3), 0.0], abs=1e-5)


def test_a_group_without_scores_is_flat():
    adv, m = group_advantages(torch.tensor([[NAN, NAN], [1.0, 0.0]]))
    assert adv[0].tolist() == [0.0, 0.0] and m["num_zero_std_groups"] == 1.0


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("scale", ["group", "batch", "none", "batch_whiten", "token_whiten"])
def test_group_family_leaves_it_out(baseline, scale):
    r, lengths = torch.tensor([[0.3, 1.0, NAN, 0.0, 0.7]]), torch.tensor([[3.0, 1.0, 9.0, 2.0, 4.0]])
    keep = [0, 1, 3, 4]
    with_it, _ = group_advantages(r, baseline=baseline, scale=scale, lengths_PG=lengths)
    without, _ = group_advantages(r[:, keep], baseline=baseline, scale=scale, lengths_PG=lengths[:, keep])
    assert torch.allclose(with_it[:, keep], without, atol=1e-6) and with_it[0, 2] == 0.0


def test_grpo_s_leaves_it_out():
    r, ent = torch.tensor([[1.0, 0.0, NAN, 1.0, 0.0]]), torch.tensor([[0.5, 1.0, 2.0, 1.5, 0.2]])
    keep = [0, 1, 3, 4]
    with_it, _ = grpo_s_advantages(r, ent)
    without, _ = grpo_s_advantages(r[:, keep], ent[:, keep])
    assert torch.allclose(with_it[:, keep], without, atol=1e-6) and with_it[0, 2] == 0.0


@pytest.mark.parametrize("normalization", ["polarity", "joint"])
def test_gtpo_leaves_it_out(normalization):
    g = torch.Generator().manual_seed(3)
    r = torch.tensor([[1.0, 0.0, NAN, 1.0, 0.0]])
    ent, mask = torch.rand((5, 4), generator=g), torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1] * 4, [1] * 4, [1] * 4])
    keep = [0, 1, 3, 4]
    with_it, m = gtpo_advantages(r, ent, mask, normalization=normalization)
    without, _ = gtpo_advantages(r[:, keep], ent[keep], mask[keep], normalization=normalization)
    assert torch.allclose(with_it[keep], without, atol=1e-6) and with_it[2].abs().sum() == 0
    assert not math.isnan(m["gtpo/shaped_reward/mean"])


def test_gigpo_and_gagpo_leave_it_out():
    # three episodes of two steps from states (A, B); episode 1 is unscorable (its outcome reward NaN)
    outcome = torch.tensor([[1.0, NAN, 0.0]])
    steps = torch.tensor([[0.0, 1.0], [0.0, NAN], [0.0, 0.0]])
    states, mask = torch.tensor([[0, 1], [0, 1], [0, 1]]), torch.ones(3, 2)
    keep = [0, 2]
    gi, _ = gigpo_advantages(outcome, steps, states, mask, gamma=0.5)
    gi_without, _ = gigpo_advantages(outcome[:, keep], steps[keep], states[keep], mask[keep], gamma=0.5)
    assert torch.allclose(gi[keep], gi_without, atol=1e-6) and gi[1].abs().sum() == 0
    ga, _ = gagpo_advantages(steps, states, mask, 3, gamma=0.5, lam=0.5)
    ga_without, _ = gagpo_advantages(steps[keep], states[keep], mask[keep], 2, gamma=0.5, lam=0.5)
    assert torch.allclose(ga[keep], ga_without, atol=1e-6) and ga[1].abs().sum() == 0


def _runner_batch():
    """What the reward runner hands the pipeline: the unscorable row's functions all NaN, its total 0."""
    sb, batch = scored([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0], 4, [2] * 8)
    sb.rewards_NF = torch.tensor([[1.0], [1.0], [NAN], [0.0], [1.0], [0.0], [1.0], [0.0]])
    assert sb.scored_N.tolist() == [True, True, False] + [True] * 5
    return sb, batch


@pytest.mark.parametrize("advantage", ["group", "grpo_s"])
def test_the_pipeline_marks_it_for_the_estimator(advantage):
    sb, batch = _runner_batch()
    inp = run(AlgoConfig(advantage=advantage), sb, batch, LogProbs(torch.zeros(8, 2), entropy=torch.ones(8, 2)))
    if advantage == "group":  # the hand-worked group above
        assert inp.advantages[:4].tolist() == pytest.approx([0.57725, 0.57725, 0.0, -1.15450], abs=1e-5)
    assert inp.advantages[2] == 0.0


def test_a_plugin_that_lets_the_nan_through_is_refused():
    @registry.register_advantage("zz_plain_mean")
    def plain(ctx):  # reads rewards_N without scored_N: its group mean is NaN
        r = ctx.rewards_N.view(-1, ctx.group_size)
        return (r - r.mean(dim=1, keepdim=True)).flatten(), {}

    try:
        sb, batch = _runner_batch()
        with pytest.raises(ValueError, match=r"1 completion\(s\) of this batch are unscorable.*ctx.scored_N"):
            run(AlgoConfig(advantage="zz_plain_mean"), sb, batch, LogProbs(torch.zeros(8, 2), entropy=torch.ones(8, 2)))
    finally:
        del registry.ADVANTAGES["zz_plain_mean"], registry.STAGE_SPECS["advantage"]["zz_plain_mean"]
