"""grpokit against verl's formulas, written out here independently from verl's
``verl/trainer/ppo/core_algos.py`` (verl is not a dependency, so its code is not imported), and
the wiring of the anchor options through config, validation, presets and the trainer.

TRL is tested as a live oracle in tests/project/test_bench_loss_equality.py.
"""

import pytest
import torch

from grpokit.algo.advantages import group_advantages, kl_penalized_rewards
from grpokit.algo.loss import kl_estimate, policy_loss
from grpokit.config import Config, ConfigError, presets
from grpokit.config.io import apply_overrides
from grpokit.validation import validate
from helpers.paths import ROOT

# ---------------------------------------------------------------- verl, written out


def verl_masked_whiten(values, mask):
    """verl's masked_whiten: masked mean, masked variance times n/(n-1) (n = mask sum), then
    (values - mean) * rsqrt(var + 1e-8)."""
    n = mask.sum()
    mean = (values * mask).sum() / n
    var = (((values - mean) ** 2) * mask).sum() / n * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def verl_rf_baseline(scores_N, index, mask_NT):
    """verl's compute_reinforce_plus_plus_baseline_outcome_advantage on outcome scores: subtract
    each prompt's mean score (0 for a prompt with one response), tile over the response length,
    mask, whiten over the mask, mask again. Returns per-token advantages (N, T)."""
    centred = scores_N.clone()
    for i in set(index):
        rows = [j for j, k in enumerate(index) if k == i]
        centred[rows] = scores_N[rows] - (scores_N[rows].mean() if len(rows) > 1 else 0.0)
    tiled = centred[:, None].expand_as(mask_NT) * mask_NT
    return verl_masked_whiten(tiled, mask_NT) * mask_NT


def verl_kl_penalty(logp, ref, kind):
    """verl's kl_penalty for "kl" (k1), "mse" (k2) and "low_var_kl" (k3, with its clamps)."""
    if kind == "kl":
        return logp - ref
    if kind == "mse":
        return 0.5 * (logp - ref) ** 2
    d = torch.clamp(ref - logp, min=-20, max=20)
    return torch.clamp(torch.exp(d) - d - 1, min=-10, max=10)


def _ragged(seed, P=4, G=3, T=9):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.rand(P, G, generator=g).round(decimals=1)
    lengths = torch.randint(1, T + 1, (P, G), generator=g)
    mask = (torch.arange(T)[None, :] < lengths.flatten()[:, None]).float()
    return rewards, lengths, mask


# ---------------------------------------------------------------- group advantages


def test_group_scales_equal_the_anchors_formulas():
    # TRL: (r - group mean) / (std + 1e-4), std unbiased over the group ("group") or the batch ("batch"),
    # none: no division. verl grpo: eps 1e-6 (torch.std, unbiased); rloo: r * n/(n-1) - mean * n/(n-1)
    r, _, _ = _ragged(5)
    mean = r.mean(dim=1, keepdim=True)
    expect = {
        ("group", 1e-4): (r - mean) / (r.std(dim=1, keepdim=True) + 1e-4),
        ("batch", 1e-4): (r - mean) / (r.std() + 1e-4),
        ("none", 1e-4): r - mean,
        ("group", 1e-6): (r - mean) / (r.std(dim=1, keepdim=True) + 1e-6),
    }
    for (scale, eps), want in expect.items():
        got, _ = group_advantages(r, scale=scale, eps=eps)
        assert torch.allclose(got, want, atol=1e-6), (scale, eps)
    n = r.shape[1]
    got, _ = group_advantages(r, baseline="leave_one_out", scale="none")
    assert torch.allclose(got, r * n / (n - 1) - mean * n / (n - 1), atol=1e-6)


# ---------------------------------------------------------------- REINFORCE++-baseline


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_whiten_equals_verl_reinforce_plus_plus_baseline(seed):
    rewards, lengths, mask = _ragged(seed)
    assert not (rewards.amax(1) == rewards.amin(1)).any()  # no flat group in these batches
    ours, _ = group_advantages(rewards, scale="token_whiten", eps=1e-8, lengths_PG=lengths)
    P, G = rewards.shape
    theirs = verl_rf_baseline(rewards.flatten(), [p for p in range(P) for _ in range(G)], mask)
    assert torch.allclose(ours.flatten()[:, None] * mask, theirs, atol=1e-5)
    # the sequence-level mode is a different estimator on the same batch
    seq, _ = group_advantages(rewards, scale="batch_whiten", eps=1e-8)
    assert not torch.allclose(seq.flatten()[:, None] * mask, theirs, atol=1e-3)


def test_flat_groups_are_the_one_deliberate_difference_from_verl():
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [0.0, 0.2, 0.9]])
    lengths = torch.tensor([[2, 7, 4], [1, 9, 3], [5, 5, 2]])
    mask = (torch.arange(9)[None, :] < lengths.flatten()[:, None]).float()
    ours, m = group_advantages(rewards, scale="token_whiten", eps=1e-8, lengths_PG=lengths)
    theirs = verl_rf_baseline(rewards.flatten(), [0, 0, 0, 1, 1, 1, 2, 2, 2], mask).view(3, 3, 9)
    ours_tok = ours[:, :, None] * mask.view(3, 3, 9)
    assert torch.allclose(ours_tok[[0, 2]], theirs[[0, 2]], atol=1e-5)  # informative groups: equal
    assert torch.equal(ours[1], torch.zeros(3)) and m["num_zero_std_groups"] == 1
    assert theirs[1].abs().sum() > 0.1  # verl gives the flat group -mu / sqrt(var + eps) on every token


# ---------------------------------------------------------------- KL: clamp and placement


def test_k3_clamp_10_equals_verl_low_var_kl_in_value_and_gradient():
    d = torch.tensor([-25.0, -12.0, -3.0, -0.4, 0.0, 0.3, 2.0, 2.7, 3.0, 25.0])
    a = torch.zeros(10, requires_grad=True)
    b = torch.zeros(10, requires_grad=True)
    ours = kl_estimate(a, d, "k3", clamp=10.0)
    theirs = verl_kl_penalty(b, d, "low_var_kl")
    assert torch.allclose(ours, theirs, atol=1e-6)
    ours.sum().backward()
    theirs.sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-6)
    assert (ours == 10.0).sum() == 5  # k3 = e^d - d - 1 > 10 at d = -25, -12, 2.7 (11.18), 3, 25


@pytest.mark.parametrize("ours, verl", [("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")])
def test_kl_in_the_reward_honours_the_estimator_as_verl(ours, verl):
    # verl: token rewards = score on the last token - beta * kl_penalty per token; an outcome
    # estimator then sums the token rewards, so the sequence reward is score - beta * sum_t KL_t
    g = torch.Generator().manual_seed(3)
    logp, ref = -torch.rand(4, 6, generator=g) * 3, -torch.rand(4, 6, generator=g) * 3
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 2, 4, 1])[:, None]).float()
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0])
    token_rewards = torch.zeros(4, 6)
    token_rewards[torch.arange(4), mask.sum(1).long() - 1] = scores
    token_rewards = token_rewards - 0.1 * verl_kl_penalty(logp, ref, verl) * mask
    r, kl = kl_penalized_rewards(scores, logp, ref, mask, 0.1, ours, clamp=10.0 if ours == "k3" else None)
    assert torch.allclose(r, token_rewards.sum(dim=1), atol=1e-6)


def test_dual_clip_3_equals_verl_vanilla_policy_loss():
    # verl's compute_policy_loss_vanilla: max(-A r, -A clip(r)), then for A < 0 min(that, -A c), c = 3
    g = torch.Generator().manual_seed(4)
    logp = -torch.rand(5, 4, generator=g)
    old = logp + torch.randn(5, 4, generator=g) * 0.3
    old[:, 0] = logp[:, 0] - 1.5  # ratio e^1.5 = 4.48 > 3: the dual bound binds for A < 0
    adv = torch.tensor([1.0, -1.0, -0.5, 2.0, -2.0])
    mask = torch.ones(5, 4)
    a, b = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    ours, m = policy_loss(a, old, adv, mask, dual_clip=3.0, aggregation="token-mean")
    ratio = torch.exp(b - old)
    A = adv[:, None]
    clipped = torch.maximum(-A * ratio, -A * torch.clamp(ratio, 0.8, 1.2))
    theirs = torch.where(A < 0, torch.minimum(-A * 3.0, clipped), clipped).mean()
    assert m["clip_ratio/dual_mean"] > 0 and torch.allclose(ours, theirs, atol=1e-6)
    ours.backward()
    theirs.backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-7)


# ---------------------------------------------------------------- config, presets, trainer


def test_anchor_options_are_validated_with_one_sentence():
    for overrides, message in [
        (["algo.kl_clamp=-1"], "algo.kl_clamp=-1.0 must be >= 0"),
        (
            ["algo.entropy_aggregation=sum"],
            "algo.entropy_aggregation='sum' is not valid; choose one of: loss, token-mean",
        ),
        (
            ["algo.beta=0.04", "algo.kl_placement=reward", "algo.kl_bias_correction=true"],
            "algo.kl_bias_correction weights the KL term of the loss",
        ),
    ]:
        with pytest.raises(ConfigError) as e:
            validate(apply_overrides(Config(), overrides))
        assert message in str(e.value) and "\n" not in str(e.value)


def test_presets_set_the_anchor_options():
    # TRL's KL correction and entropy aggregation are filled where the run has a KL term / an entropy bonus
    trl = presets.apply("trl-default", apply_overrides(Config(), ["algo.beta=0.04", "algo.entropy_coef=0.01"]))
    assert trl.algo.kl_bias_correction is True and trl.algo.entropy_aggregation == "token-mean"
    assert trl.algo.adv_eps == 1e-4 and trl.algo.aggregation == "token-mean"
    validate(trl)
    # ... and not where it has none (beta 0, no bonus: TRL's own defaults), where they would be inert
    bare = presets.apply("trl-default", Config())
    assert (bare.algo.kl_bias_correction, bare.algo.entropy_aggregation) == (False, "loss")
    validate(bare)
    rpp = presets.apply("reinforce-pp", Config())
    assert rpp.algo.scale == "token_whiten" and rpp.algo.adv_eps == 1e-8
    assert Config().algo.kl_bias_correction is False and Config().algo.kl_clamp == 0.0  # grpokit's defaults


def test_trainer_passes_lengths_estimator_and_clamp(tiny_model_dir, tmp_path, monkeypatch):
    import grpokit.algo.estimators as E
    import grpokit.algo.pipeline as T
    from helpers.runs import make

    seen = {}
    real_adv, real_kl = E.group_advantages, T.kl_penalized_rewards

    def spy_adv(rewards_PG, **kw):
        seen["lengths"], seen["scale"] = kw["lengths_PG"].clone(), kw["scale"]
        return real_adv(rewards_PG, **kw)

    def spy_kl(*args):
        seen["kl_args"] = args[5:]
        return real_kl(*args)

    monkeypatch.setattr(E, "group_advantages", spy_adv)
    monkeypatch.setattr(T, "kl_penalized_rewards", spy_kl)
    tr = make(
        tiny_model_dir,
        tmp_path / "run",
        **{
            "algo.scale": "token_whiten",
            "algo.beta": 0.04,
            "algo.kl_placement": "reward",
            "algo.kl_estimator": "k3",
            "algo.kl_clamp": 10,
            "train.steps": 1,
        },
    )
    m = tr.train_step()
    assert seen["scale"] == "token_whiten" and seen["kl_args"] == ("k3", 10.0)
    assert seen["lengths"].shape == (2, 4) and seen["lengths"].mean().item() == pytest.approx(
        m["completions/mean_length"]
    )
    assert m["kl"] >= 0  # k3 summed over tokens is never negative


def test_defaults_table_in_the_docs_matches_the_code():
    import dataclasses
    import re

    from grpokit.config import AlgoConfig

    doc = (ROOT / "docs" / "ALGORITHMS.md").read_text()
    section = doc.split("## Defaults", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `algo\.(\w+)` \| `([^`]*)` \|", section, flags=re.M))
    defaults = {
        f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(AlgoConfig)
    }
    assert len(rows) >= 20 and set(rows) <= set(defaults)
    for name, text in rows.items():
        value = defaults[name]
        if isinstance(value, bool):
            assert text == str(value).lower(), name
        elif isinstance(value, (int, float)):
            assert float(text) == value, name
        elif isinstance(value, list):
            assert text == str(value), name
        else:
            assert text == value, name
