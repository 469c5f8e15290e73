"""The update (train/update.py) on a tiny model with the masks that narrow the loss (DAPO's overlong filter)
and those that narrow the policy term only (the entropy top-fraction): what the normalisers count, what the
logged entropy is over, and the clip metrics added up over micro-batches."""

import pytest
import torch

from grpokit.algo.pipeline import LogProbs, StepSettings, update_inputs
from grpokit.config.sections import AlgoConfig, OptimConfig
from grpokit.train.logprobs import completion_logprobs
from grpokit.train.update import Accumulator, Forwards, accumulate, apply_update, make_optimizer
from helpers.equal_ranks import TwoEqualRanks
from helpers.models import tiny_llama
from helpers.pipeline_batches import scored

# 4 completions of 4 tokens after a 2-token prompt; row 0 was cut by the length limit
IDS = torch.tensor([[3, 9, 27, 5, 11, 30], [7, 7, 1, 6, 2, 13], [4, 8, 15, 16, 23, 12], [5, 5, 10, 20, 25, 31]])


def _update(algo: AlgoConfig, micro_batch_size: int = 0, old_shift: float = 0.0):
    """One update of a fresh tiny model on IDS with ``algo``: (its metrics, the inputs, pi_old's log-probs and
    entropies). ``old_shift``: pi_old's log-probs moved by ``old_shift * (row - 1.5)``, so the ratios differ."""
    model = tiny_llama(vocab_size=32)
    with torch.no_grad():  # a peaked head: token entropies far apart (a random head's are all near ln 32)
        model.lm_head.weight.mul_(40.0)
    sb, batch = scored([1.0, 0.0, 1.0, 0.5], 4, [4] * 4, finish=["length", "eos", "eos", "eos"])
    attn = torch.ones_like(IDS)
    batch = type(batch)(IDS, attn, attn.cumsum(1) - 1, IDS[:, 2:].clone(), torch.ones(4, 4))
    with torch.no_grad():
        logp, ent = completion_logprobs(model, batch, with_entropy=True)
    old = logp + old_shift * (torch.arange(4.0)[:, None] - 1.5)
    inputs = update_inputs(StepSettings(algo, norm_constant=4.0), sb, batch, LogProbs(old, None, ent))
    opt, sched = make_optimizer(model, OptimConfig(lr=0.0), 1)
    acc = Accumulator()
    accumulate(model, opt, inputs, acc, Forwards(micro_batch_size=micro_batch_size))
    return apply_update(opt, sched, acc, OptimConfig(lr=0.0)), inputs, logp, ent


def test_the_logged_entropy_leaves_masked_truncated_completions_out():
    # TRL's mask_truncated_completions: the entropy metric is over the loss mask, rows 1-3 (12 tokens)
    m, inputs, _, ent = _update(AlgoConfig(mask_truncated=True))
    assert inputs.loss_mask[0].sum() == 0
    assert m["entropy"] == pytest.approx(float(ent[1:].mean()), rel=1e-5)
    assert abs(float(ent[1:].mean()) - float(ent.mean())) > 1e-2  # row 0's entropies would move it


def test_the_entropy_mask_narrows_the_policy_term_not_the_normalisers():
    # entropy top-fraction 0.5 of the 16 tokens: 8 carry the policy gradient, all 16 count in token-mean's
    # divisor. On-policy (ratio 1) the loss is -sum over the kept tokens of A / 16. Advantages: rewards
    # [1, 0, 1, 0.5], mean 0.625, Bessel std sqrt((0.140625 + 0.390625 + 0.140625 + 0.015625) / 3) = 0.47871
    algo = AlgoConfig(entropy_top_fraction=0.5, aggregation="token-mean")
    m, inputs, _, ent = _update(algo)
    assert inputs.loss_mask.sum() == 16 and inputs.policy_mask.sum() == 8
    adv = (torch.tensor([1.0, 0.0, 1.0, 0.5]) - 0.625) / (0.478714 + 1e-4)
    assert m["loss"] == pytest.approx(float(-(adv[:, None] * inputs.policy_mask).sum() / 16), rel=1e-4)
    assert m["entropy"] == pytest.approx(float(ent.mean()), rel=1e-5)  # every loss token, as TRL's metric


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_micro_batches_add_up_to_the_batch_clip_metrics_included(level):
    # ratios exp(+-0.3 * (row - 1.5)) clip on some rows; one micro-batch of 4 rows or four of 1 log the same
    # loss and clip metrics: at the sequence level each micro-batch's share is over its own sequence, weighed
    # by 1 sequence (not by its tokens) when they are added up, and the extremes are the rows' min / max
    algo = AlgoConfig(ratio_level=level, entropy_top_fraction=0.5, num_iterations=2)
    whole, _, _, _ = _update(algo, 0, old_shift=0.3)
    parts, _, _, _ = _update(algo, 1, old_shift=0.3)
    keys = [k for k in whole if k.startswith("clip_ratio/")] + ["loss"]
    assert {k: parts[k] for k in keys} == pytest.approx({k: whole[k] for k in keys}, abs=1e-6)
    assert whole["clip_ratio/region_mean"] > 0 and whole["clip_ratio/high_max"] >= whole["clip_ratio/high_mean"]


def test_a_batch_that_does_not_cut_into_equal_updates_is_refused_not_trimmed():
    """12 rows in 8 updates would train on 8 of them (the floor of 12 / 8 rows a slice) and drop 4 unseen."""
    from types import SimpleNamespace

    from grpokit.train.update import update_slices

    inputs = SimpleNamespace(batch=SimpleNamespace(input_ids=torch.zeros(12, 3)))
    with pytest.raises(ValueError, match="a batch of 12 rows does not cut into 8 equal updates"):
        update_slices(inputs, 8)


# ------------------------------------------------------------------ collectives: how many, and how few


def _slice_inputs(policy_mask):
    from types import SimpleNamespace

    from grpokit.algo.pipeline import UpdateInputs, loss_settings

    settings, norms = loss_settings(AlgoConfig())
    loss_mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # 2 rows, 5 loss tokens
    batch = SimpleNamespace(input_ids=torch.zeros(2, 3))
    return UpdateInputs(
        batch, torch.zeros(2), loss_mask, None, None, policy_mask=policy_mask, loss=settings, norms=norms
    )


def test_a_slices_counts_are_one_all_reduce_and_the_policy_count_only_under_a_policy_mask():
    from grpokit.train.update import begin_slice

    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    ranks = TwoEqualRanks()
    # no policy mask: (rows, loss tokens) in one all-reduce, 2 + 2 = 4 sequences, 5 + 5 = 10 tokens; the policy
    # term covers the loss mask, so its count is the loss tokens' without a third sum
    _, norms = begin_slice(model, opt, _slice_inputs(None), Accumulator(), dist=ranks)
    assert ranks.calls == [2]
    assert (norms.num_sequences, norms.num_tokens, norms.num_policy_tokens) == (4.0, 10.0, 10.0)
    # a policy mask of 1 token a row: 2 here, 4 over the two ranks, in the same all-reduce
    acc = Accumulator()
    _, norms = begin_slice(model, opt, _slice_inputs(torch.tensor([[1.0, 0, 0], [1.0, 0, 0]])), acc, dist=ranks)
    assert ranks.calls == [2, 3]
    assert (norms.num_sequences, norms.num_tokens, norms.num_policy_tokens) == (4.0, 10.0, 4.0)
    assert acc.tokens == 10.0  # the slice's loss tokens over every rank: the update's token metrics divide by them


def test_a_slice_of_a_window_takes_its_batchs_counts_without_a_collective():
    from grpokit.train.update import begin_slice
    from grpokit.train.update_windows import SliceCounts

    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    ranks, acc = TwoEqualRanks(), Accumulator()
    counts = SliceCounts(num_sequences=12.0, num_tokens=30.0, num_policy_tokens=6.0, slice_tokens=10.0)
    _, norms = begin_slice(model, opt, _slice_inputs(None), acc, dist=ranks, counts=counts)
    assert ranks.calls == []  # taken once for the whole batch (update_windows.batch_counts)
    assert (norms.num_sequences, norms.num_tokens, norms.num_policy_tokens, acc.tokens) == (12.0, 30.0, 6.0, 10.0)


def test_an_updates_sums_are_one_all_reduce_and_a_mismatch_maximum_stays_the_ranks():
    model = torch.nn.Linear(1, 1)
    opt, sched = make_optimizer(model, OptimConfig(lr=0.0), 1)
    acc = Accumulator(loss=0.25, tokens=8.0, ent_sum=3.0, ent_tok=6.0, sampled=True)
    acc.sums, acc.units = {"kl": 4.0, "clip_ratio/region_mean": 1.0}, {"clip_ratio/region_mean": 2.0}
    acc.mismatch = {"tokens": 6.0, "abs_diff": 1.2, "k3": 0.6, "outside": 0.0, "abs_diff_max": 0.5}
    ranks = TwoEqualRanks()
    m = apply_update(opt, sched, acc, OptimConfig(lr=0.0), dist=ranks)
    # loss, entropy sum and tokens (3), the four terms, two sums, one unit, four mismatch sums: 14 numbers, once
    assert ranks.calls == [14]
    assert m["loss"] == 0.5  # 0.25 on each rank
    assert m["entropy"] == 0.5  # (3 + 3) / (6 + 6)
    assert m["kl"] == 1.0  # 8 / the slices' 8 tokens (acc.tokens: already the job's)
    assert m["clip_ratio/region_mean"] == 0.5  # 2 / 4 sequences
    assert m["mismatch/logp_abs_diff_mean"] == pytest.approx(2.4 / 12)
    assert m["mismatch/logp_abs_diff_max"] == 0.5  # this rank's: reduce_metrics takes the max over ranks


def test_the_bonus_reads_the_loss_masks_entropy_sums_when_no_policy_mask_narrows_it():
    from grpokit.train.update import add_loss_metrics

    entropy = torch.tensor([[1.0, 2.0, 4.0], [0.5, 0.5, 8.0]])
    loss_mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    m = {"num_tokens": 5.0, "entropy/bonus": -0.1}
    acc = Accumulator()
    add_loss_metrics(acc, m, entropy, loss_mask)
    # over the loss mask: 1 + 2 + 0.5 + 0.5 + 8 = 12 over 5 tokens, for the entropy metric and the bonus alike
    assert (acc.ent_sum, acc.ent_tok) == (12.0, 5.0)
    assert (acc.terms["sum"], acc.terms["tokens"], acc.terms["entropy/bonus"]) == (12.0, 5.0, -0.1)
    # the entropy top-fraction keeps tokens 1 of row 0 and 2 of row 1 in the policy term: 2 + 8 = 10 over 2
    acc = Accumulator()
    add_loss_metrics(acc, m, entropy, loss_mask, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    assert (acc.ent_sum, acc.ent_tok, acc.terms["sum"], acc.terms["tokens"]) == (12.0, 5.0, 10.0, 2.0)
