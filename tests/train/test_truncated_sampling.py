"""Truncation-aware importance sampling: with top-k, top-p or min-p the sampler records the log-probability of
the truncated, renormalised distribution it drew from, and the trainer's side of the sampler ratio (TIS, IcePop /
MIS, mismatch/*) is pi_old renormalised over the same support (rollout/sampling.py support_log_mass)."""

import dataclasses
import math

import pytest
import torch

from grpokit.algo.pipeline import LogProbs
from grpokit.algo.tis import mismatch_sums, tis_weights
from grpokit.rollout.hf import generate
from grpokit.rollout.sampling import SamplingParams, sample_tokens, support_log_mass
from grpokit.train.logprobs import completion_logprobs, completion_logprobs_on_support
from grpokit.train.token_batch import make_token_batch
from helpers.mismatch import mismatch_trainer

P4 = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)  # a 4-token vocabulary's probabilities


def _mass(logits, target, loss_temperature=None, **kw):
    """The support's log mass; the kept tokens picked at the sampler's temperature, their mass measured at
    ``loss_temperature`` (default: the sampler's)."""
    p = SamplingParams(**kw)
    t = p.temperature if loss_temperature is None else loss_temperature
    return support_log_mass(logits[None], torch.tensor([target]), p, temperature=t).item()


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


def test_the_samplers_temperature_picks_the_support_and_the_losss_measures_its_mass_worked_by_hand():
    x = P4.log()  # at temperature 1 the distribution is P4 = (0.4, 0.3, 0.2, 0.1)
    # at the sampler's temperature 0.5: P4^2 / 0.30 = (0.16, 0.09, 0.04, 0.01) / 0.30 = (0.533, 0.3, 0.133, 0.033)
    # min-p 0.3 there: threshold 0.3 * 0.533 = 0.16 -> {0, 1} (at temperature 1 it would be 0.12 -> {0, 1, 2})
    # measured at the loss temperature 1: 0.4 + 0.3 = 0.7 (not 0.9, the support picked at 1; not 0.833, at 0.5)
    assert math.isclose(_mass(x, 1, loss_temperature=1.0, min_p=0.3, temperature=0.5), math.log(0.7), rel_tol=1e-12)
    # top-p 0.75 at 0.5: mass before each 0, 0.533, 0.833 -> {0, 1} (at 1: 0, 0.4, 0.7 < 0.75 -> {0, 1, 2})
    assert math.isclose(_mass(x, 0, loss_temperature=1.0, top_p=0.75, temperature=0.5), math.log(0.7), rel_tol=1e-12)
    # top-k picks the same tokens at any temperature: {0, 1}; at the loss temperature 0.5 their mass is 0.833
    assert math.isclose(_mass(x, 0, loss_temperature=0.5, top_k=2, temperature=1.0), math.log(0.25 / 0.30))


def test_the_pi_old_pass_is_at_the_loss_temperature_whatever_the_samplers(tiny_model):
    # The sampler drew at 0.5 with top-k 3; the loss is at 1.0. pi_old is the loss's distribution (the update's
    # ratio divides by it), so it equals the plain pass at 1.0 and differs from the one at the sampler's 0.5.
    params = SamplingParams(max_new_tokens=6, temperature=0.5, top_k=3)
    ro = generate(tiny_model, [[1, 5, 6, 7]], 4, params, eos_token_ids={2}, pad_token_id=0)
    batch = make_token_batch(ro, pad_token_id=0)
    m = batch.completion_mask.bool()
    with torch.no_grad():
        old, _, mass = completion_logprobs_on_support(tiny_model, batch, params, temperature=1.0)
        at_loss, _ = completion_logprobs(tiny_model, batch, temperature=1.0)
        at_sampler, _ = completion_logprobs(tiny_model, batch, temperature=0.5)
    assert torch.equal(old[m], at_loss[m]) and not torch.allclose(old[m], at_sampler[m], atol=1e-3)
    assert (mass[m] < 0).all()  # top-3 of a larger vocabulary keeps less than the whole mass


def _written_sampler(tr, temperature: float):
    """What grpokit.trl's ``trainer.generation_config.temperature = t`` does (held_generation.apply): the
    sampler's settings change, the config's temperature (the loss's) stays."""
    tr.params = dataclasses.replace(tr.params, temperature=temperature)


@pytest.mark.parametrize("cut", [{"rollout.top_k": 5}, {"rollout.top_p": 0.9}, {"rollout.min_p": 0.1}])
@pytest.mark.parametrize("apart", ["written", "loss_temperature"])
def test_a_sampler_temperature_apart_from_the_losss_trains_on_policy_at_the_first_pass(tmp_path, cut, apart):
    # One step with num_iterations 1: pi_old and the update's pi_theta are the same weights at the same (loss)
    # temperature, so every ratio is 1 and nothing clips, while mismatch/* measures the real gap between the
    # sampler at 0.5 and the loss's distribution. Before, a truncating sampler's pi_old pass ran at the sampler's
    # temperature: ratio/mean 0.85, clipped tokens.
    over = {"algo.loss_temperature": 1.2, "rollout.temperature": 0.5} if apart == "loss_temperature" else {}
    tr = mismatch_trainer(tmp_path, **cut, **over)
    if apart == "written":
        _written_sampler(tr, 0.5)
    m = tr.train_step()
    assert m["ratio/mean"] == pytest.approx(1.0, abs=1e-6) and m["clip_ratio/region_mean"] == 0.0
    assert m["mismatch/logp_abs_diff_mean"] > 1e-3  # the temperatures' gap, shown
    loss_t = 1.2 if apart == "loss_temperature" else 1.0  # the field's, else rollout.temperature's (default 1.0)
    assert tr.loss_temperature == loss_t and tr.params.temperature == 0.5

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
        old, _, mass = completion_logprobs_on_support(tiny_model, batch, params, temperature=0.7, chunk_size=3)
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
    from helpers.mismatch import RecordingLLM

    tr = mismatch_trainer(tmp_path, **{"rollout.top_k": 5, "rollout.top_p": 0.9, "rollout.temperature": 0.8})
    tr.use_engine(VLLMColocated(RecordingLLM(tr, 0.0), lambda **kw: NS(**kw), tr.params, sleep=True))
    tr.cfg.rollout.backend = "vllm"
    m = tr.train_step()
    assert m["mismatch/logp_abs_diff_max"] < 1e-4 and m["mismatch/outside_fraction"] == 0.0
    assert m["tis/ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m["tis/capped_fraction"] == 0.0
