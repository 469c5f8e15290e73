"""TRL's vLLM importance sampling correction equals grpokit's TIS stage (TRL used as an oracle only).

``bench/trl_oracle.trl_is_ratio`` runs the two blocks of TRL's sampling method that compute the
ratio and its ``sampling/*`` metrics on fixed tensors; ``trl_loss`` multiplies that ratio into TRL's
per-token loss. grpokit computes ``tis.tis_weights`` and applies them as its pipeline does: a factor of
each token's policy term (``policy_weight_NT``; VESPO: its sampler log-weight), the advantages left as
given. Both must agree on the weights, the logged metrics, the loss and its gradient, in all four modes,
with and without bounds. vLLM is not installed: the math and the mapping are tested, not a vLLM run.
"""

import math
import sys

import pytest
import torch

from helpers.mismatch import RecordingLLM, mismatch_trainer

pytest.importorskip("trl")
from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from grpokit.algo.pipeline import LogProbs, TISSettings  # noqa: E402
from grpokit.algo.tis import TIS_MODES, tis_weights  # noqa: E402
from grpokit.config.io import apply_overrides  # noqa: E402
from grpokit.config.sections import AlgoConfig, Config, ConfigError  # noqa: E402
from grpokit.trl.config import GRPOConfig  # noqa: E402
from grpokit.trl.mapping import to_config  # noqa: E402
from grpokit.validation import validate  # noqa: E402
from helpers.pipeline_batches import run, scored  # noqa: E402
from trl_oracle import fixed_batch, grpokit_loss, trl_is_ratio, trl_loss  # noqa: E402


def _sampler(old):
    """Sampler logprobs off by ~N(0, 0.9): token ratios fall on both sides of [0.5, 2], row products too."""
    return old + 0.9 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("mode", TIS_MODES)
@pytest.mark.parametrize("bounds", [(None, 3.0), (0.5, 2.0), (0.5, None)])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "cispo", "sapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_weights_metrics_loss_and_gradient_equal_trl(mode, bounds, loss_type, level):
    # at sequence level TRL multiplies each sequence's loss by the token's ratio: with GSPO's sequence ratio
    # (grpokit.trl's sequence_whole) a token weight scales the whole sequence's gradient. The clip metrics read
    # the advantages' sign, not the weight's: a token the *_mask modes zero still counts where it is clipped
    logp, old, ref, adv, mask = fixed_batch()
    samp = _sampler(old)
    clip_min, clip_max = bounds
    ratio, trl_metrics = trl_is_ratio(old, samp, mask, mode, clip_min, clip_max)
    w, metrics = tis_weights(old, samp, mask, math.inf if clip_max is None else clip_max, mode, clip_min or 0.0)
    real = mask.bool()
    assert torch.allclose(w[real], ratio.expand_as(w)[real], rtol=1e-6)
    for key, value in trl_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-6), key
    out = []
    for fn, kw in ((trl_loss, {"is_ratio": ratio}), (grpokit_loss, {"is_weights": w})):
        x, kw["metrics"] = logp.clone().requires_grad_(True), {}
        eps_high = 5.0 if loss_type == "cispo" else 0.2  # cispo: TRL's epsilon_high is the weight cap
        loss = fn(
            x,
            old,
            ref,
            adv,
            mask,
            loss_type=loss_type,
            beta=0.04,
            bias_correction=True,
            epsilon_high=eps_high,
            level=level,
            **kw,
        )
        loss.backward()
        out.append((loss, x.grad, kw["metrics"]))
    (theirs, g_theirs, m_theirs), (ours, g_ours, m_ours) = out
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6)
    assert torch.allclose(g_ours, g_theirs, atol=1e-7, rtol=1e-6)
    clip_keys = [k for k in m_theirs if k.startswith("clip_ratio/") or k == "cispo_clip_ratio"]
    assert bool(clip_keys) == (loss_type != "sapo")  # TRL logs no clip share for SAPO's soft gate
    for key in clip_keys:
        assert m_ours[key] == pytest.approx(m_theirs[key], rel=1e-6, abs=1e-9), key


def test_masked_tokens_keep_their_clip_count_by_hand():
    # two tokens of one sequence, A = +1, ratio pi/pi_old = e^0.5 = 1.65 > 1 + 0.2 on both: both are clipped high.
    # token_mask weights [1, 0] (the second token's sampler ratio left the bounds): the weight takes the second
    # token out of the gradient, not out of the clip count: high_mean = 2/2 = 1 (TRL), not 1/2 (A * w = 0 there)
    logp, old, mask, adv = torch.full((1, 2), 0.5), torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([1.0])
    w = torch.tensor([[1.0, 0.0]])
    for fn, kw in ((trl_loss, {"is_ratio": w}), (grpokit_loss, {"is_weights": w})):
        m = {}
        fn(logp, old, None, adv, mask, loss_type="dapo", beta=0.0, metrics=m, **kw)
        assert (m["clip_ratio/high_mean"], m["clip_ratio/high_max"]) == (1.0, 1.0), fn.__name__


def test_the_batch_exercises_every_bound():
    # the check above can fail: token ratios and row products both leave [0.5, 2], so each mode changes weights
    _, old, _, _, mask = fixed_batch()
    samp = _sampler(old)
    for mode in TIS_MODES:
        w, m = tis_weights(old, samp, mask, 2.0, mode, 0.5)
        assert 0 < m["tis/capped_fraction"] < 1, mode
    assert (tis_weights(old, samp, mask, 2.0, "sequence_mask", 0.5)[0] == 0).any()


def test_trl_arguments_map_to_the_tis_stage():
    c = to_config(
        GRPOConfig("o", use_vllm=True), num_rows=4
    )  # TRL's defaults: sequence_mask, clip_max 3, clip_min None
    assert (c.rollout.tis_mode, c.rollout.tis_cap, c.rollout.tis_min) == ("sequence_mask", 3.0, 0.0)
    c = to_config(
        GRPOConfig(
            "o",
            use_vllm=True,
            vllm_importance_sampling_mode="token_mask",
            vllm_importance_sampling_clip_min=0.5,
            vllm_importance_sampling_clip_max=None,
        ),
        num_rows=4,
    )
    assert (c.rollout.tis_mode, c.rollout.tis_cap, c.rollout.tis_min) == ("token_mask", math.inf, 0.5)  # None: no bound
    c = to_config(GRPOConfig("o", use_vllm=True, vllm_importance_sampling_clip_min=-1.0), num_rows=4)
    assert c.rollout.tis_min == 0.0  # ratios are > 0: a negative bound bounds nothing
    assert (
        to_config(GRPOConfig("o", use_vllm=True, vllm_importance_sampling_correction=False), num_rows=4).rollout.tis_cap
        == 0.0
    )
    for kwargs, words in [
        ({"vllm_importance_sampling_clip_max": 0.5}, "vllm_importance_sampling_clip_max=0.5"),
        ({"vllm_importance_sampling_clip_min": 4.0}, "vllm_importance_sampling_clip_min=4.0"),
        ({"vllm_importance_sampling_mode": "token"}, "vllm_importance_sampling_mode='token'"),
    ]:
        with pytest.raises(ConfigError, match=words):
            to_config(GRPOConfig("o", use_vllm=True, **kwargs), num_rows=4)


def test_the_pipeline_stage_applies_the_mode():
    # sampler logprobs 0; old = [ln 2, ln 2] on row 0 (product 4, outside cap 3 -> masked), [0, 0] on row 1 (kept, 1).
    # rewards [1, 0] in one group of 2: mean 0.5, std sqrt(0.5) = 0.7071 -> advantages +-0.5 / 0.7071 = +-0.7071
    sb, batch = scored([1.0, 0.0], 2, [2, 2])
    old = torch.tensor([[math.log(2)] * 2, [0.0, 0.0]])
    inp = run(AlgoConfig(), sb, batch, LogProbs(old), tis=TISSettings(cap=3.0, mode="sequence_mask"))
    # a weight of the policy term, the advantages left as the estimator gave them (TRL: loss times ratio)
    assert inp.policy_weight.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert inp.advantages.tolist() == pytest.approx([0.7071, -0.7071], rel=1e-3)
    assert inp.metrics["sampling/importance_sampling_ratio/min"] == 0.0
    # TRL's batch dict, as a subclass's compute_loss receives it: the advantages and the ratio side by side
    from grpokit.trl.contract.stages import trl_batch

    d = trl_batch(inp, slice(None), 4.0)
    assert d["importance_sampling_ratio"].tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert d["advantages"].tolist() == pytest.approx([0.7071, -0.7071], rel=1e-3)


def test_tis_fields_are_checked():
    stale = "rollout.async_staleness=1"  # a sampler TIS reads: the synchronous hf engine samples with pi_old itself
    validate(
        apply_overrides(
            Config(), [stale, "rollout.tis_mode=sequence_mask", "rollout.tis_min=0.5", "rollout.tis_cap=.inf"]
        )
    )
    for over, word in (
        (["rollout.tis_mode=sequence"], r"rollout.tis_mode='sequence' is not valid"),
        (["rollout.tis_min=-0.1"], r"rollout.tis_min=-0.1 must be"),
        (["rollout.tis_min=3", "rollout.tis_cap=2"], r"rollout.tis_min=3.0 must be .* at most rollout.tis_cap=2.0"),
    ):
        with pytest.raises(ConfigError, match=word):
            validate(apply_overrides(Config(), [stale, *over]))


@pytest.mark.parametrize("setting", ["rollout.tis_mode=token_mask", "rollout.tis_min=0.5", "rollout.tis_cap=3"])
def test_tis_settings_with_the_synchronous_hf_sampler_are_refused(setting):
    """The hf engine samples with pi_old's own weights, so TIS has no ratio to correct: a changed setting would
    change nothing. Turning TIS off (tis_cap=0) is accepted; the same setting with a stale sampler is read."""
    name, value = setting.split("=")
    default = {"tis_mode": "'token_truncate'", "tis_min": "0.0", "tis_cap": "2.0"}[name.split(".")[1]]
    shown = {"token_mask": "'token_mask'", "0.5": "0.5", "3": "3.0"}[value]
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), [setting]))
    assert str(e.value) == (
        f"{name}={shown} has no effect with rollout.backend=hf and rollout.async_staleness=0 (the sampler is pi_old "
        "itself: there is no mismatch to correct); set rollout.backend=vllm or vllm_server, or "
        f"rollout.async_staleness >= 1, or leave it {default}"
    )
    validate(apply_overrides(Config(), ["rollout.tis_cap=0"]))
    validate(apply_overrides(Config(), ["rollout.async_staleness=1", setting]))


def test_a_vllm_step_logs_trl_metrics_and_masks_by_the_sequence_product(tmp_path):
    # the colocated engine's outputs (a recording fake: vLLM is not installed) with every sampler logprob
    # 0.8 nats below the trainer's: each token's r = e^0.8 = 2.23, a completion of L tokens has e^(0.8 L)
    from types import SimpleNamespace as NS

    from grpokit.rollout.vllm import VLLMColocated

    tr = mismatch_trainer(tmp_path)  # built on the hf engine, which TIS does not read: its settings come after
    tr.use_engine(VLLMColocated(RecordingLLM(tr, -0.8), lambda **kw: NS(**kw), tr.params, sleep=True))
    tr.cfg.rollout.backend, tr.cfg.rollout.tis_mode, tr.cfg.rollout.tis_cap = "vllm", "sequence_mask", 3.0
    m = tr.train_step()
    assert m["sampling/sampling_logp_difference/mean"] == pytest.approx(0.8, abs=1e-3)
    # one weight per completion; every completion here has two or more tokens: e^(0.8 L) >= e^1.6 = 4.95 > 3,
    # so all are masked to 0 (the geometric mean, e^0.8 = 2.23, would have kept them all)
    assert m["tis/ratio_mean"] == pytest.approx(math.exp(0.8), rel=1e-3) and m["tis/capped_fraction"] == 1.0
    assert [m[f"sampling/importance_sampling_ratio/{k}"] for k in ("min", "mean", "max")] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask"])
@pytest.mark.parametrize("bounds", [(None, 3.0), (0.5, 2.0)])
def test_vespo_folds_the_sampler_ratio_into_its_weight_as_trl(mode, bounds):
    # TRL adds sum_t clamp(log r_t, log 1e-8, 20) to VESPO's log w and does not multiply the loss by r_t;
    # loss, gradient and vespo/phi_seq_mean must equal TRL's on the same fixed tensors
    logp, old, ref, adv, mask = fixed_batch()
    logp = old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(2))  # w near 1: phi not ~0
    samp = old + 0.2 * torch.randn(old.shape, generator=torch.Generator().manual_seed(3))
    clip_min, clip_max = bounds
    ratio, _ = trl_is_ratio(old, samp, mask, mode, clip_min, clip_max)
    w, _ = tis_weights(old, samp, mask, math.inf if clip_max is None else clip_max, mode, clip_min or 0.0)
    out = []
    for fn, kw in ((trl_loss, {"is_ratio": ratio}), (grpokit_loss, {"is_weights": w})):
        x, m = logp.clone().requires_grad_(True), {}
        loss = fn(x, old, ref, adv, mask, loss_type="vespo", beta=0.0, metrics=m, **kw)
        loss.backward()
        out.append((loss, x.grad, m["vespo/phi_seq_mean"]))
    (theirs, g_theirs, phi_theirs), (ours, g_ours, phi_ours) = out
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6) and torch.allclose(g_ours, g_theirs, atol=1e-7, rtol=1e-6)
    assert phi_ours == pytest.approx(phi_theirs, rel=1e-5)
    # the check can fail: without the sampler's share the weights differ
    plain = grpokit_loss(logp.clone(), old, ref, adv, mask, loss_type="vespo", beta=0.0)
    assert not torch.allclose(plain, theirs, rtol=1e-4)


def test_vespo_with_tis_in_the_pipeline_keeps_the_advantages():
    # sampler logprobs 0; old = [ln 2, ln 2] on row 0: r_t = 2 each, token_truncate cap 3 keeps them,
    # so the sampler's log w of row 0 is 2 ln 2 = 1.386; row 1 (old 0) gets 0. Advantages stay +-0.7071.
    sb, batch = scored([1.0, 0.0], 2, [2, 2])
    old = torch.tensor([[math.log(2)] * 2, [0.0, 0.0]])
    a = AlgoConfig(objective="vespo", ratio_level="trajectory", aggregation="token-mean")
    inp = run(a, sb, batch, LogProbs(old), tis=TISSettings(cap=3.0, mode="token_truncate"))
    assert inp.sampler_log_weight.tolist() == pytest.approx([2 * math.log(2), 0.0], rel=1e-5)
    assert inp.advantages.flatten().tolist()[:1] == pytest.approx([0.7071], rel=1e-3)
    with pytest.raises(ValueError, match="tis_mode='sequence_mask'"):
        run(a, sb, batch, LogProbs(old), tis=TISSettings(cap=3.0, mode="sequence_mask"))


def test_trl_vespo_with_vllm_maps_token_modes_and_refuses_sequence_modes_as_trl():
    c = to_config(
        GRPOConfig("o", use_vllm=True, loss_type="vespo", vllm_importance_sampling_mode="token_mask"), num_rows=4
    )
    assert (c.algo.objective, c.rollout.tis_mode, c.rollout.tis_cap) == ("vespo", "token_mask", 3.0)
    with pytest.raises(ConfigError, match="VESPO loss requires `vllm_importance_sampling_mode`.*Got: sequence_mask"):
        to_config(GRPOConfig("o", use_vllm=True, loss_type="vespo"), num_rows=4)
