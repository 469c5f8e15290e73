"""The update (train/update.py) on a tiny model with the masks that narrow the loss (DAPO's overlong filter)
and those that narrow the policy term only (the entropy top-fraction): what the normalisers count, what the
logged entropy is over, and the clip metrics added up over micro-batches."""

import pytest
import torch

from grpokit.algo.pipeline import LogProbs, StepSettings, update_inputs
from grpokit.config.sections import AlgoConfig, OptimConfig
from grpokit.train.logprobs import completion_logprobs
from grpokit.train.update import Accumulator, Forwards, accumulate, apply_update, make_optimizer
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
