"""Sampler/trainer mismatch: the metrics (hand-worked), IcePop / MIS masks, and engines compared on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.algo.tis import mismatch_mask, mismatch_metrics, mismatch_sums, pad_sampling_logprobs, sampled_rows
from grpokit.config import Config, ConfigError, apply_overrides
from grpokit.data.tasks.demo_model import load_demo_model
from grpokit.rollout.hf import SamplingParams, generate
from grpokit.train.logprobs import completion_logprobs
from grpokit.train.token_batch import make_token_batch
from helpers.mismatch import RecordingLLM, mismatch_trainer


def test_mismatch_sums_hand_worked():
    # log r = train - sampler on the 3 real tokens: [log 3, 0, log 0.25]; the 4th is padding
    train = torch.tensor([[math.log(0.3), math.log(0.5)], [math.log(0.1), 0.0]])
    sampler = torch.tensor([[math.log(0.1), math.log(0.5)], [math.log(0.4), -7.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    m = mismatch_metrics(mismatch_sums(train, sampler, mask, 0.5, 2.0))
    # |log r| = log 3 + 0 + log 4 = log 12 over 3 tokens; max log 4
    assert m["mismatch/logp_abs_diff_mean"] == pytest.approx(math.log(12) / 3)
    assert m["mismatch/logp_abs_diff_max"] == pytest.approx(math.log(4))
    # k3 = (r - 1) - log r: (2 - log 3) + 0 + (-0.75 + log 4)
    assert m["mismatch/k3_kl"] == pytest.approx((2 - math.log(3) - 0.75 + math.log(4)) / 3)
    # r = 3 and r = 0.25 are outside [0.5, 2]
    assert m["mismatch/outside_fraction"] == pytest.approx(2 / 3)


def test_equal_logprobs_measure_zero():
    x = torch.randn(3, 5)
    m = mismatch_metrics(mismatch_sums(x, x.clone(), torch.ones(3, 5), 0.5, 2.0))
    assert all(v == 0.0 for v in m.values())


def test_masks_token_and_sequence_hand_worked():
    # row 0: log r = [log 3, 0] (geometric mean sqrt 3 = 1.73, inside); row 1: [log 4, log 4] (mean 4, outside)
    old = torch.tensor([[math.log(3), 0.0], [math.log(4), math.log(4)]])
    sampler = torch.zeros(2, 2)
    mask = torch.ones(2, 2)
    keep, m = mismatch_mask(old, sampler, mask, "token", 0.5, 2.0)
    assert keep.tolist() == [[0.0, 1.0], [0.0, 0.0]] and m["mismatch/masked_fraction"] == 0.75
    keep, m = mismatch_mask(old, sampler, mask, "sequence", 0.5, 2.0)
    assert keep.tolist() == [[1.0, 1.0], [0.0, 0.0]] and m["mismatch/masked_fraction"] == 0.5
    keep, _ = mismatch_mask(old, sampler, torch.tensor([[1.0, 0.0], [0.0, 0.0]]), "token", 0.5, 2.0)
    assert keep.tolist() == [[0.0, 1.0], [1.0, 1.0]]  # padding keeps 1 (its loss mask is 0 anyway)
    keep, m = mismatch_mask(old, sampler, mask, "none", 0.5, 2.0)
    assert torch.equal(keep, torch.ones(2, 2)) and m["mismatch/masked_fraction"] == 0.0


def test_rows_without_sampler_logprobs_are_left_out():
    assert sampled_rows([[-0.1, 0.0], [0.0, 0.0], []]).tolist() == [1.0, 0.0, 0.0]


@pytest.fixture(scope="module")
def demo():
    model, tok = load_demo_model()
    return model.eval(), tok


@pytest.mark.parametrize("engine", ["static", "dynamic"])
def test_engines_match_the_trainer_and_a_perturbed_sampler_shows(demo, engine):
    model, tok = demo
    prompts = [tok("12+34=")["input_ids"], tok("7+5=")["input_ids"]]
    ro = generate(
        model,
        prompts,
        4,
        SamplingParams(max_new_tokens=6),
        eos_token_ids={tok.eos_token_id},
        pad_token_id=tok.pad_token_id,
        generator=torch.Generator().manual_seed(0),
        engine=engine,
    )
    batch = make_token_batch(ro, tok.pad_token_id)
    with torch.no_grad():
        train, _ = completion_logprobs(model, batch)
    sampler = pad_sampling_logprobs(ro.sampling_logprobs, batch.width)
    m = mismatch_metrics(mismatch_sums(train, sampler, batch.completion_mask, 0.5, 2.0))
    # same model, same float32 numerics: only summation order differs
    assert m["mismatch/logp_abs_diff_max"] < 1e-4 and abs(m["mismatch/k3_kl"]) < 1e-6
    assert m["mismatch/outside_fraction"] == 0.0
    bumped = sampler - 0.8 * batch.completion_mask  # a sampler 0.8 nats more sure of every token: r = e^0.8 = 2.23 > 2
    p = mismatch_metrics(mismatch_sums(train, bumped, batch.completion_mask, 0.5, 2.0))
    assert p["mismatch/logp_abs_diff_mean"] == pytest.approx(0.8, abs=1e-4)
    assert p["mismatch/k3_kl"] == pytest.approx(math.exp(0.8) - 1 - 0.8, abs=1e-3)
    assert p["mismatch/outside_fraction"] == 1.0


def test_every_step_logs_mismatch_and_masking_runs(tmp_path):
    tr = mismatch_trainer(tmp_path)
    m = tr.train_step()
    assert m["mismatch/logp_abs_diff_max"] < 1e-4 and m["mismatch/outside_fraction"] == 0.0
    tr = mismatch_trainer(tmp_path / "b", **{"rollout.mismatch_mask": "token"})
    m = tr.train_step()
    assert m["mismatch/masked_fraction"] == 0.0 and "mismatch/k3_kl" in m


def test_mismatch_fields_are_checked():
    from grpokit.validation import validate

    for over, word in (
        (["rollout.mismatch_mask=tokens"], "rollout.mismatch_mask"),
        (["rollout.mismatch_low=0"], "rollout.mismatch_low"),
        (["rollout.mismatch_high=0.9"], "rollout.mismatch_high"),
    ):
        with pytest.raises(ConfigError, match=word):
            validate(apply_overrides(Config(), over))


@pytest.mark.parametrize("shift", [0.0, -0.8])
def test_vllm_outputs_feed_the_mismatch_metrics_like_the_hf_engine(tmp_path, shift):
    from types import SimpleNamespace as NS

    from grpokit.rollout.vllm import VLLMColocated

    tr = mismatch_trainer(tmp_path)
    tr.use_engine(VLLMColocated(RecordingLLM(tr, shift), lambda **kw: NS(**kw), tr.params, sleep=True))
    tr.cfg.rollout.backend = "vllm"  # as if built on a GPU: the step samples through vLLM's output shape
    m = tr.train_step()
    if shift == 0.0:  # the recorded logprobs are the trainer's own (summation order only)
        assert m["mismatch/logp_abs_diff_max"] < 1e-4 and m["mismatch/outside_fraction"] == 0.0
    else:  # every token 0.8 nats more likely to the sampler: r = e^0.8 = 2.23 outside [0.5, 2]
        assert m["mismatch/logp_abs_diff_mean"] == pytest.approx(0.8, abs=1e-4)
        assert m["mismatch/k3_kl"] == pytest.approx(math.exp(0.8) - 1 - 0.8, abs=1e-3)
        assert m["mismatch/outside_fraction"] == 1.0
