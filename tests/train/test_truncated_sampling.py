"""Truncation-aware importance sampling: with top-k, top-p or min-p the sampler records the log-probability of
the truncated, renormalised distribution it drew from, and the trainer's side of the sampler ratio (TIS, IcePop /
MIS, mismatch/*) is pi_old renormalised over the same support (rollout/sampling.py support_log_mass)."""

import math

import pytest
import torch

from grpokit.algo.pipeline import LogProbs
from grpokit.algo.tis import mismatch_sums, tis_weights
from grpokit.rollout.hf import generate
from grpokit.rollout.sampling import SamplingParams, sample_tokens, support_log_mass
from grpokit.train.logprobs import completion_logprobs_on_support
from grpokit.train.token_batch import make_token_batch

P4 = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)  # a 4-token vocabulary's probabilities


def _mass(logits, target, **kw):
    return support_log_mass(logits[None], torch.tensor([target]), SamplingParams(**kw)).item()


def test_support_mass_is_the_kept_probability_worked_by_hand():
    x = P4.log()  # at temperature 1 the distribution is P4 itself
    # top-k 2 keeps {0, 1}: mass 0.4 + 0.3 = 0.7
    assert math.isclose(_mass(x, 1, top_k=2), math.log(0.7), rel_tol=1e-12)
    # top-p 0.6: sorted 0.4, 0.3, 0.2, 0.1; mass before each 0, 0.4, 0.7, 0.9; kept while that is < 0.6 -> {0, 1}
    assert math.isclose(_mass(x, 0, top_p=0.6), math.log(0.7), rel_tol=1e-12)
    # top-p 0.75: 0.7 < 0.75 keeps token 2 too -> 0.9
    assert math.isclose(_mass(x, 0, top_p=0.75), math.log(0.9), rel_tol=1e-12)
    # min-p 0.6: tokens below 0.6 * 0.4 = 0.24 go -> {0, 1}, 0.7
    assert math.isclose(_mass(x, 1, min_p=0.6), math.log(0.7), rel_tol=1e-12)
    # top-k 2 then top-p 0.5 on the renormalised pair (4/7, 3/7): 4/7 >= 0.5 already, so only {0}: 0.4
    assert math.isclose(_mass(x, 0, top_k=2, top_p=0.5), math.log(0.4), rel_tol=1e-12)
    # the temperature comes first: logits 0.5 * log P4 at temperature 0.5 are P4 again
    assert math.isclose(_mass(0.5 * x, 1, top_k=2, temperature=0.5), math.log(0.7), rel_tol=1e-12)
    # a target outside the trainer's support is counted in (the sampler drew it): {0, 1, 3} -> 0.8
    assert math.isclose(_mass(x, 3, top_k=2), math.log(0.8), rel_tol=1e-12)
    # nothing truncated: mass 1, log 0
    assert _mass(x, 2) == 0.0


def test_the_sampler_records_the_truncated_renormalised_log_probability():
    # top-k 2: every draw is token 0 or 1 (off-support tokens cannot occur), logged as log(p / 0.7)
    g = torch.Generator().manual_seed(0)
    logits = P4.float().log()[None].repeat(400, 1)
    tok, logp = sample_tokens(logits, SamplingParams(top_k=2), g)
    assert set(tok.tolist()) == {0, 1}
    expected = torch.log(P4[tok] / 0.7).float()
    assert torch.allclose(logp, expected, atol=1e-6)


def test_tis_and_mismatch_compare_pi_old_on_the_samplers_support_worked_by_hand():
    # The sampler (q = P4) drew token 1 with top-k 2 and recorded log(0.3 / 0.7) = log(3/7).
    # pi_old differs a little (another engine's numerics): (0.42, 0.28, 0.2, 0.1), the same top two.
    sampler = torch.tensor([[math.log(3 / 7)]])
    pi_old = torch.tensor([0.42, 0.28, 0.2, 0.1], dtype=torch.float64)
    old = pi_old.log()[1].reshape(1, 1).float()
    mass = torch.tensor([[_mass(pi_old.log(), 1, top_k=2)]]).float()  # log(0.42 + 0.28) = log 0.7
    mask = torch.ones(1, 1)
    # full-distribution pi_old: ratio 0.28 / (3/7) = 0.6533, the kept mass 0.7 times the true mismatch 0.9333
    _, biased = tis_weights(old, sampler, mask, cap=2.0)
    assert math.isclose(biased["tis/ratio_mean"], 0.28 * 7 / 3, rel_tol=1e-5)
    # on the support: (0.28 / 0.7) / (3/7) = 0.4 * 7 / 3 = 0.9333, the engines' own disagreement only
    on = LogProbs(old=old, support_mass=mass).on_support()
    w, m = tis_weights(on, sampler, mask, cap=2.0)
    assert math.isclose(m["tis/ratio_mean"], 0.4 * 7 / 3, rel_tol=1e-5)
    assert math.isclose(w.item(), 0.4 * 7 / 3, rel_tol=1e-5)
    sums = mismatch_sums(on, sampler, mask, 0.5, 2.0)
    assert math.isclose(sums["abs_diff"], abs(math.log(0.4 * 7 / 3)), rel_tol=1e-5)


@pytest.mark.parametrize("engine", ["static", "dynamic"])
def test_on_the_own_engine_pi_old_on_support_equals_the_samplers_record(tiny_model, engine):
    # The HF engine samples with top-k 5, top-p 0.9 at temperature 0.7 from the same weights the trainer
    # scores with: renormalised over the replayed support, the ratio is 1 to float rounding; the full
    # distribution's log-probability is lower by the kept mass's log (the bias this replay removes).
    params = SamplingParams(max_new_tokens=8, temperature=0.7, top_k=5, top_p=0.9)
    g = torch.Generator().manual_seed(0)
    ro = generate(
        tiny_model, [[1, 5, 6, 7], [1, 9]], 3, params, eos_token_ids={2}, pad_token_id=0, generator=g, engine=engine
    )
    batch = make_token_batch(ro, pad_token_id=0)
    with torch.no_grad():
        old, _, mass = completion_logprobs_on_support(tiny_model, batch, params, chunk_size=3)
    sampler = torch.zeros_like(old)
    for i, lp in enumerate(ro.sampling_logprobs):
        sampler[i, : len(lp)] = torch.tensor(lp)
    m = batch.completion_mask.bool()
    assert torch.allclose((old - mass)[m], sampler[m], atol=1e-4)
    assert (mass[m] < -1e-3).any()  # the truncation cut real mass: the uncorrected ratio would be off
    assert not torch.allclose(old[m], sampler[m], atol=1e-3)


def test_a_step_with_top_k_and_top_p_through_the_vllm_path_measures_no_truncation_bias(tmp_path):
    # The vLLM stand-in samples with the trainer's own model and returns the truncated logprobs it drew with
    # (vLLM's processed_logprobs); TIS is on (backend vllm). Before the replay the ratio was the kept mass
    # (< 1 at every truncated position); on the support it is 1 to float rounding.
    from types import SimpleNamespace as NS

    from grpokit.rollout.vllm import VLLMColocated
    from helpers.mismatch import RecordingLLM, mismatch_trainer

    tr = mismatch_trainer(tmp_path, **{"rollout.top_k": 5, "rollout.top_p": 0.9, "rollout.temperature": 0.8})
    tr.use_engine(VLLMColocated(RecordingLLM(tr, 0.0), lambda **kw: NS(**kw), tr.params, sleep=True))
    tr.cfg.rollout.backend = "vllm"
    m = tr.train_step()
    assert m["mismatch/logp_abs_diff_max"] < 1e-4 and m["mismatch/outside_fraction"] == 0.0
    assert m["tis/ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m["tis/capped_fraction"] == 0.0
