"""Hand-worked cases that kill mutants the other algo tests let survive (``make mutate``, docs/MUTATION.md).

Each test pins a detail a mutation tester changed without any other test noticing: an edge value of a
metric, a keyword passed through, a boundary (``<`` vs ``<=``), the exact words of an error.
"""

import math
import re

import pytest
import torch

from grpokit.algo.advantages import (
    BASELINES,
    STD_KINDS,
    _stats,
    group_advantages,
    kl_penalized_rewards,
    normalize_components,
    process_advantages,
    token_whiten,
)
from grpokit.algo.tis import tis_weights

# ---------------------------------------------------------------- group_advantages: errors and metrics


def test_group_advantages_errors_name_the_shape_and_the_valid_choices():
    with pytest.raises(ValueError, match=re.escape("must be 2-D (P prompts, G completions), got shape (3,)")):
        group_advantages(torch.zeros(3))
    with pytest.raises(ValueError, match=re.escape(f"unknown baseline 'x'; valid: {', '.join(BASELINES)}")):
        group_advantages(torch.zeros(1, 2), baseline="x")
    with pytest.raises(ValueError, match=re.escape(f"unknown std kind 'x'; valid: {', '.join(STD_KINDS)}")):
        group_advantages(torch.zeros(1, 2), std="x")


def test_group_advantages_reports_advantage_statistics_under_their_names():
    # rewards [0, 1], group scale, eps 0: centred [-0.5, 0.5], unbiased std sqrt(0.5) -> A = [-1/sqrt2, 1/sqrt2]
    adv, m = group_advantages(torch.tensor([[0.0, 1.0]]), eps=0.0)
    assert torch.allclose(adv, torch.tensor([[-1.0, 1.0]]) / math.sqrt(2))
    assert m["advantages/mean"] == pytest.approx(0.0, abs=1e-7)
    assert m["advantages/max"] == pytest.approx(1 / math.sqrt(2))
    assert m["advantages/min"] == pytest.approx(-1 / math.sqrt(2))
    assert m["advantages/std"] == pytest.approx(1 / math.sqrt(2))  # population std of +-a is a


def test_batch_scale_adds_eps_to_the_batch_std():
    # rewards [[0, 2]]: centred [-1, 1]; batch std (unbiased, over 2 values) sqrt(2); eps 0.5:
    # A = [-1, 1] / (sqrt(2) + 0.5)
    adv, _ = group_advantages(torch.tensor([[0.0, 2.0]]), scale="batch", eps=0.5)
    assert torch.allclose(adv, torch.tensor([[-1.0, 1.0]]) / (math.sqrt(2) + 0.5))


# ---------------------------------------------------------------- token_whiten (REINFORCE++-baseline)


def test_token_whiten_default_eps_and_population_std_pass_through():
    # centred [-1, 1], lengths [1, 3]: n = 4, mu = (-1 + 3) / 4 = 0.5,
    # sum L (c - mu)^2 = 1 * 2.25 + 3 * 0.25 = 3; unbiased var = 3 / 3 = 1; population var = 3 / 4
    c, L = torch.tensor([[-1.0, 1.0]]), torch.tensor([[1.0, 3.0]])
    assert torch.allclose(token_whiten(c, L), torch.tensor([[-1.5, 0.5]]) / math.sqrt(1 + 1e-8))
    assert torch.allclose(token_whiten(c, L, std="population", eps=0.0), torch.tensor([[-1.5, 0.5]]) / math.sqrt(0.75))
    assert torch.allclose(token_whiten(c, L, eps=3.0), torch.tensor([[-1.5, 0.5]]) / 2.0)  # sqrt(1 + 3)
    # group_advantages passes std through: rewards [0, 2] centre to [-1, 1], lengths [1, 3] as above
    adv, _ = group_advantages(
        torch.tensor([[0.0, 2.0]]), scale="token_whiten", std="population", eps=0.0, lengths_PG=torch.tensor([[1, 3]])
    )
    assert torch.allclose(adv, torch.tensor([[-1.5, 0.5]]) / math.sqrt(0.75))
    adv, _ = group_advantages(
        torch.tensor([[0.0, 2.0]]), scale="token_whiten", eps=3.0, lengths_PG=torch.tensor([[1, 3]])
    )
    assert torch.allclose(adv, torch.tensor([[-1.5, 0.5]]) / 2.0)


def test_token_whiten_one_token_in_the_batch_and_empty_completions():
    # one token in all: n = 1, mu = c_0 = 2 (not c_0 / 2), var's divisor clamps at 1 -> A_0 = 0
    out = token_whiten(torch.tensor([[2.0, 5.0]]), torch.tensor([[1.0, 0.0]]), eps=1.0)
    assert out[0, 0].item() == pytest.approx(0.0)
    assert out[0, 1].item() == pytest.approx(3.0)  # (5 - 2) / sqrt(0 + 1)
    # population with n = 1: divisor n - 0 = 1 (an unbiased divisor would be 0, clamped to 1 as well)
    # zero-length completions are valid lengths; negative ones are refused in one sentence
    group_advantages(torch.tensor([[0.0, 1.0]]), scale="token_whiten", lengths_PG=torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="lengths_PG must be non-negative token counts shaped like the rewards"):
        group_advantages(torch.tensor([[0.0, 1.0]]), scale="token_whiten", lengths_PG=torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="^scale 'token_whiten' weights completions by their length; pass lengths_PG"):
        group_advantages(torch.tensor([[0.0, 1.0]]), scale="token_whiten")


# ---------------------------------------------------------------- small helpers


def test_stats_of_nothing_are_zeros_and_std_is_the_population_one():
    assert _stats("p", torch.tensor([])) == {"p/mean": 0.0, "p/std": 0.0, "p/min": 0.0, "p/max": 0.0}
    # one value: numel 1 is not "empty"; [0, 2]: population std 1 (the unbiased one would be sqrt 2)
    assert _stats("p", torch.tensor([3.0])) == {"p/mean": 3.0, "p/std": 0.0, "p/min": 3.0, "p/max": 3.0}
    assert _stats("p", torch.tensor([0.0, 2.0]))["p/std"] == pytest.approx(1.0)


def test_normalize_components_weights_nan_and_default_eps():
    # one group of G = 2, two components: comp 0 = [0, 2] -> dev [-1, 1], unbiased std sqrt 2;
    # comp 1 = [0, 4] -> dev [-2, 2], std 2 sqrt 2; z = dev / (std + eps), eps 1e-4 by default;
    # weights 2 and 0.5 multiply: r_1 = 2 / (sqrt2 + 1e-4) + 0.5 * 2 / (2 sqrt2 + 1e-4), r_0 = -r_1
    r = torch.tensor([[[0.0, 0.0], [2.0, 4.0]]])  # (P=1, G=2, F=2)
    r1 = 2 / (math.sqrt(2) + 1e-4) + 1 / (2 * math.sqrt(2) + 1e-4)
    assert torch.allclose(normalize_components(r, torch.tensor([2.0, 0.5])), torch.tensor([[-r1, r1]]), atol=1e-6)
    # eps is added to the std, not taken away: eps 1 -> 1 / (sqrt2 + 1) + 2 / (2 sqrt2 + 1)
    r1 = 1 / (math.sqrt(2) + 1) + 2 / (2 * math.sqrt(2) + 1)
    assert torch.allclose(normalize_components(r, torch.ones(2), eps=1.0), torch.tensor([[-r1, r1]]), atol=1e-6)
    # a NaN (the function does not apply) is left out of the statistics and contributes 0:
    # [0, 2, nan] -> valid [0, 2]: dev [-1, 1], std sqrt 2
    out = normalize_components(torch.tensor([[[0.0], [2.0], [float("nan")]]]), torch.ones(1), eps=0.0)
    assert torch.allclose(
        out, torch.tensor([[-1.0, 1.0, 0.0]]) / torch.tensor([math.sqrt(2), math.sqrt(2), 1.0]), atol=1e-6
    )


def test_kl_penalized_rewards_passes_the_clamp_to_the_estimator():
    # one token, logp - ref = 3; k1 estimate 3, clamped to 1 -> r = 1 - beta * 1 = 0.5 with beta 0.5
    r, kl = kl_penalized_rewards(
        torch.tensor([1.0]), torch.tensor([[3.0]]), torch.tensor([[0.0]]), torch.ones(1, 1), 0.5, "k1", 1.0
    )
    assert kl.tolist() == [1.0]
    assert r.tolist() == [0.5]


def test_process_advantages_names_the_group_size_and_counts_flat_groups_per_prompt():
    with pytest.raises(ValueError, match="^3 completions do not split into groups of 2$"):
        process_advantages(torch.zeros(3, 1), torch.ones(3, 1, dtype=torch.long), torch.ones(3, 1), 2, 4)
    # P = 2 prompts of G = 2, one step each: group 0 flat ([1, 1]), group 1 not ([0, 1]) -> fraction 1/2
    _, m = process_advantages(
        torch.tensor([[1.0], [1.0], [0.0], [1.0]]), torch.zeros(4, 1, dtype=torch.long), torch.ones(4, 1), 2, 1
    )
    assert m["frac_reward_zero_std"] == pytest.approx(0.5)
    assert m["num_zero_std_groups"] == 1.0
    assert "advantages/mean" in m


# ---------------------------------------------------------------- TIS


def test_tis_cap_boundary_metrics_and_a_single_token():
    with pytest.raises(ValueError, match=re.escape("the TIS cap must be >= 1, got 0.5")):
        tis_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), 0.5)
    w, m = tis_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), 1.0)  # cap exactly 1 is valid
    assert w.tolist() == [[1.0]]
    # ratio exactly at the cap is not "capped": old - sampler = ln 2, cap 2; one real token (n = 1)
    w, m = tis_weights(torch.tensor([[math.log(2.0), 0.0]]), torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), 2.0)
    assert m["tis/capped_fraction"] == 0.0
    assert m["tis/ratio_mean"] == pytest.approx(2.0)  # sum over the one real token / 1 (not / 2)
    assert m["tis/logp_abs_diff_mean"] == pytest.approx(math.log(2.0))
    # no real token: the largest ratio reads 1 (no mismatch), not an error
    _, m = tis_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), 2.0)
    assert m["tis/ratio_max"] == 1.0
    _, m = tis_weights(torch.tensor([[math.log(0.5)]]), torch.zeros(1, 1), torch.ones(1, 1), 2.0)
    assert m["tis/ratio_max"] == pytest.approx(0.5)  # a real token's ratio, even below 1


# ---------------------------------------------------------------- objectives through the registry (ClipSettings)


def test_surrogate_adapter_clip_dual_clip_and_cispo():
    from grpokit.algo.loss import surrogate
    from grpokit.algo.settings import ClipSettings

    ratio, adv, logp = torch.tensor([[1.5, 4.0]]), torch.tensor([[1.0, -1.0]]), torch.tensor([[-1.0, -1.0]])
    # clip 0.2 / 0.3: token 0 min(1.5 * 1, clamp(1.5, 0.8, 1.3) * 1) = 1.3; token 1 min(-4, -1.3) = -4
    assert torch.allclose(
        surrogate(ratio, adv, logp, ClipSettings(clip_low=0.2, clip_high=0.3)), torch.tensor([[1.3, -4.0]])
    )
    # dual clip 3 bounds the negative-advantage token from below: max(-4, 3 * -1) = -3
    assert torch.allclose(surrogate(ratio, adv, logp, ClipSettings(dual_clip=3.0)), torch.tensor([[1.2, -3.0]]))
    # CISPO: sg(min(rho, 1 + clip_high)) * A * logp: [1.2 * 1 * -1, 1.2 * -1 * -1]
    assert torch.allclose(surrogate(ratio, adv, logp, ClipSettings(objective="cispo")), torch.tensor([[-1.2, 1.2]]))


# ---------------------------------------------------------------- step tensors of GiGPO / GAGPO episodes


def test_step_tensors_put_the_outcome_on_the_last_turn_and_number_states_in_order():
    from types import SimpleNamespace

    from grpokit.algo.estimators import _step_tensors
    from grpokit.types import Episode, Rollout

    # G = 2, P = 2. Episode 0: two turns, states "a", "b"; episode 1: one turn, no state keys (-> "p0");
    # episode 2: three turns "b", "a", "c"; episode 3: one turn, no keys (-> "p1", its prompt p = 3 // 2 = 1).
    eps = [
        Episode([1, 1], [0, 1], ["a", "b"]),
        Episode([1], [0]),
        Episode([1, 1, 1], [0, 1, 2], ["b", "a", "c"]),
        Episode([1], [0]),
    ]
    ro = Rollout([[1], [1]], [[5, 5], [5], [5, 5, 5], [5]], [[0.0] * 2, [0.0], [0.0] * 3, [0.0]], ["eos"] * 4, 2, eps)
    ctx = SimpleNamespace(
        scored=SimpleNamespace(rollout=ro), group_size=2, rewards_N=torch.tensor([1.0, 2.0, 3.0, 4.0])
    )
    rewards, states, mask = _step_tensors(ctx)
    assert rewards.tolist() == [[0, 1, 0], [2, 0, 0], [0, 0, 3], [4, 0, 0]]
    # ids in order of first sight: a 0, b 1, p0 2, c 3, p1 4
    assert states.tolist() == [[0, 1, 0], [2, 0, 0], [1, 0, 3], [4, 0, 0]]
    assert mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]]
    assert states.dtype == torch.long


# ---------------------------------------------------------------- the registry and the loss records


def test_registry_lookup_import_paths_and_messages(tmp_path, monkeypatch):
    from grpokit.algo import registry

    assert registry.is_import_path("m:f") and not registry.is_import_path("m:") and not registry.is_import_path(":f")
    assert not registry.is_import_path("plain")
    (tmp_path / "regmod_x.py").write_text("def adv(ctx):\n    return ctx, {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = registry.lookup("advantage", "regmod_x:adv")
    assert fn(1) == (1, {}) and registry.ADVANTAGES["regmod_x:adv"] is fn  # imported once, then cached
    assert "regmod_x:adv" not in registry.registered("advantage")  # import paths are not listed as names
    assert registry.registered("objective")[:3] == ["clip", "cispo", "sapo"]  # built-ins first, in order
    with pytest.raises(ValueError) as e:
        registry.lookup("objective", "nosuch")
    assert (
        str(e.value)
        == "unknown objective 'nosuch'; choose one of: "
        + ", ".join(registry.registered("objective"))
        + " (or a module:function)"
    )
    with pytest.raises(ValueError) as e:
        registry.lookup("token mask", "regmod_x:missing")
    assert str(e.value).startswith("token mask 'regmod_x:missing' could not be imported (")
    assert str(e.value).endswith(
        "give a module:function on sys.path or one of: " + ", ".join(registry.registered("token mask"))
    )
    del registry.ADVANTAGES["regmod_x:adv"]


def test_each_register_decorator_fills_its_own_table():
    from grpokit.algo import registry

    tables = {
        "register_advantage": registry.ADVANTAGES,
        "register_objective": registry.OBJECTIVE_FNS,
        "register_token_mask": registry.TOKEN_MASKS,
        "register_reward_stage": registry.REWARD_STAGES,
        "register_advantage_stage": registry.ADVANTAGE_STAGES,
        "register_policy_weight": registry.POLICY_WEIGHTS,
    }
    for name, table in tables.items():

        def fn():
            return None

        assert getattr(registry, name)("zz_probe")(fn) is fn  # the decorator returns the function itself
        assert table.pop("zz_probe") is fn
        assert all("zz_probe" not in t for t in tables.values())


def test_loss_settings_carry_every_algo_field():
    from grpokit.algo.pipeline import loss_settings
    from grpokit.algo.sapo import SAPOParams
    from grpokit.algo.settings import ClipSettings, EntropyBonus, KLSettings, LossSettings, Normalisers
    from grpokit.config.sections import AlgoConfig

    a = AlgoConfig(
        objective="sapo",
        clip_low=0.1,
        clip_high=0.3,
        dual_clip=3.0,
        ratio_level="sequence",
        sapo_tau_pos=0.7,
        sapo_tau_neg=1.3,
        beta=0.05,
        kl_estimator="k2",
        kl_bias_correction=True,
        kl_clamp=10.0,
        entropy_coef=0.01,
        entropy_aggregation="token-mean",
        offpolicy_delta=0.2,
        aggregation="token-mean",
    )
    assert loss_settings(a) == (
        LossSettings(
            ClipSettings("sapo", 0.1, 0.3, 3.0, "sequence", params=SAPOParams(0.7, 1.3)),
            KLSettings(0.05, "k2", True, 10.0),
            EntropyBonus(0.01, "token-mean"),
            0.2,
        ),
        Normalisers("token-mean"),
    )
    # 0 means "off" in the config and None in the records; the KL goes to the reward with kl_placement=reward
    s, n = loss_settings(AlgoConfig(beta=0.05, kl_placement="reward"))
    assert s.clip.dual_clip is None and s.kl.clamp is None and s.offpolicy_delta is None and s.kl.beta == 0.0
    assert n == Normalisers("seq-mean-token-mean")


def test_group_advantages_passes_flat_rtol_and_token_whiten_with_two_tokens():
    # [1, 1.1] with flat_rtol 0.5: spread 0.1 <= 0.5 * 1.1 -> flat, zero advantage
    adv, m = group_advantages(torch.tensor([[1.0, 1.1]]), flat_rtol=0.5)
    assert torch.equal(adv, torch.zeros(1, 2)) and m["num_zero_std_groups"] == 1.0
    # centred [-1, 1], one token each: n = 2, mu = 0, unbiased var = 2 / (2 - 1) = 2 -> A = [-1, 1] / sqrt(2)
    assert torch.allclose(
        token_whiten(torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2), eps=0.0), torch.tensor([[-1.0, 1.0]]) / math.sqrt(2)
    )


def test_pipeline_plugged_stages_and_tis_below_one():
    from types import SimpleNamespace as NS

    from grpokit.algo.pipeline import (
        MismatchSettings,
        StepSettings,
        TISSettings,
        needed_logprobs,
        policy_weight_names,
        sampler_record,
    )
    from grpokit.config.sections import AlgoConfig

    # built-in objectives and estimators declared their needs; a plugin advantage, mask or objective did not
    assert not any(needed_logprobs(StepSettings(AlgoConfig(objective=o)))[2] for o in ("clip", "cispo", "sapo"))
    assert needed_logprobs(StepSettings(AlgoConfig(token_masks=["m:f"])))[2]
    assert needed_logprobs(StepSettings(AlgoConfig(advantage="my:fn")))[2]
    assert needed_logprobs(StepSettings(AlgoConfig(objective="my:obj")))[2]
    # a TIS cap is on whenever it is above 0 (0 means off), 0.5 included: it needs pi_old's log-probs
    s = StepSettings(AlgoConfig(), tis=TISSettings(cap=0.5), mismatch=MismatchSettings())
    assert policy_weight_names(s) == ["tis"] and needed_logprobs(s) == (True, False, False)
    # rows the sampler did not score (all-zero logprobs) leave the sampler mask: 1 * 0, not 1 / 0
    _, m = sampler_record(NS(sampling_logprobs=[[-1.0], [0.0]]), NS(completion_mask=torch.ones(2, 1), width=1))
    assert m.tolist() == [[1.0], [0.0]]


def test_flat_groups_keepdim_keeps_one_column():
    # [[1, 1], [0, 1]]: group 0 flat, group 1 not; keepdim gives (P, 1), not a (P, P) broadcast of hi and lo
    from grpokit.algo.advantages import flat_groups

    out = flat_groups(torch.tensor([[1.0, 1.0], [0.0, 1.0]]), keepdim=True)
    assert out.shape == (2, 1) and out.flatten().tolist() == [True, False]


# ---------------------------------------------------------------- GTPO / GRPO-S normalisation


def test_moments_edge_cases_and_both_stds():
    from grpokit.algo.entropy_shaping import _moments

    mu, sd = _moments(torch.tensor([]), "unbiased")
    assert mu.shape == () and sd.shape == () and mu.item() == 0.0 and sd.item() == 0.0
    mu, sd = _moments(torch.tensor([5.0]), "unbiased")  # one value: its mean, and no spread to estimate
    assert mu.item() == 5.0 and sd.shape == () and sd.item() == 0.0
    # [1, 3]: mean 2; unbiased std sqrt(((1-2)^2 + (3-2)^2) / 1) = sqrt(2); population std sqrt(2 / 2) = 1
    assert _moments(torch.tensor([1.0, 3.0]), "unbiased")[1].item() == pytest.approx(math.sqrt(2))
    assert _moments(torch.tensor([1.0, 3.0]), "population")[1].item() == pytest.approx(1.0)


# group 0: two right (rows 0-1), two wrong (rows 2-3), with different entropies; group 1 (rows 4-7) flat
GTPO_R = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
GTPO_H = torch.tensor([[0.9, 0.2, 0.5], [0.4, 0.3, 0.6], [0.8, 0.6, 0.7], [0.2, 0.9, 0.0]] + [[0.5] * 3] * 4)
GTPO_M = torch.tensor([[1.0, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]] + [[1.0] * 3] * 4)


def test_gtpo_polarity_advantages_are_standardised_per_polarity_with_metrics():
    from grpokit.algo.entropy_shaping import gtpo_advantages

    adv, m = gtpo_advantages(GTPO_R, GTPO_H, GTPO_M)
    pos, neg = GTPO_M.bool().clone(), GTPO_M.bool().clone()
    pos[2:] = False  # rows 0-1 are the O+ completions; rows 2-3 are O-; the flat group (rows 4-7) has none
    neg[:2], neg[4:] = False, False
    for sel in (pos, neg):  # eq. 6: each polarity has mean 0 and (with eps > 0) a std just below 1
        assert adv[sel].mean().item() == pytest.approx(0.0, abs=1e-5)
        assert 0.99 < adv[sel].std().item() < 1.0
    assert torch.equal(adv[4:], torch.zeros(4, 3))  # flat group: no advantage
    assert m["frac_reward_zero_std"] == 0.5 and m["num_zero_std_groups"] == 1.0  # 1 flat group of P = 2
    assert "advantages/mean" in m and "gtpo/shaped_reward/mean" in m
    # the defaults are the unbiased std and eps 1e-4; the population std and another eps give other values
    same, _ = gtpo_advantages(GTPO_R, GTPO_H, GTPO_M, std="unbiased", eps=1e-4)
    assert torch.equal(adv, same)
    assert not torch.allclose(adv, gtpo_advantages(GTPO_R, GTPO_H, GTPO_M, std="population")[0])
    assert not torch.allclose(adv, gtpo_advantages(GTPO_R, GTPO_H, GTPO_M, eps=1.0)[0])
    joint, _ = gtpo_advantages(GTPO_R, GTPO_H, GTPO_M, normalization="joint")
    real = GTPO_M.bool().clone()
    real[4:] = False
    assert joint[real].mean().item() == pytest.approx(0.0, abs=1e-5)
    assert joint[:2].min() > joint[2:4][real[2:4]].max()  # joint keeps the sign: right above wrong


def test_gtpo_passes_alpha1_and_names_bad_normalisations():
    from grpokit.algo.entropy_shaping import GTPO_NORMALIZATIONS, gtpo_advantages, gtpo_token_rewards

    shaped, _, _ = gtpo_token_rewards(GTPO_R, GTPO_H, GTPO_M, alpha1=0.5, alpha2=0.1)
    _, m = gtpo_advantages(GTPO_R, GTPO_H, GTPO_M, alpha1=0.5, alpha2=0.1, normalization="joint")
    valid = GTPO_M.bool().clone()
    valid[4:] = False
    assert m["gtpo/shaped_reward/mean"] == pytest.approx(shaped[valid].mean().item())  # alpha1 reached the rewards
    _, m1 = gtpo_advantages(GTPO_R, GTPO_H, GTPO_M, alpha1=1.0, alpha2=0.1, normalization="joint")
    assert m1["gtpo/shaped_reward/mean"] != pytest.approx(m["gtpo/shaped_reward/mean"])
    with pytest.raises(ValueError) as e:
        gtpo_advantages(GTPO_R, GTPO_H, GTPO_M, normalization="both")
    assert str(e.value) == f"unknown GTPO normalization 'both'; valid: {', '.join(GTPO_NORMALIZATIONS)}"


# ---------------------------------------------------------------- GiGPO / GAGPO options and metrics

# P = 1 prompt, G = 3 episodes of up to 2 steps; state ids: both steps of episodes 0 and 1 act from
# states 0 then 1 (anchor states shared), episode 2 has one step from state 0.
GI_EP = torch.tensor([[1.0, 0.0, 0.5]])
GI_STEP = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.5, 0.0]])
GI_STATE = torch.tensor([[0, 1], [0, 1], [0, 0]])
GI_MASK = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])


def test_gigpo_defaults_options_and_metrics():
    from grpokit.algo.credit import gigpo_advantages

    adv, m = gigpo_advantages(GI_EP, GI_STEP, GI_STATE, GI_MASK)
    same, _ = gigpo_advantages(GI_EP, GI_STEP, GI_STATE, GI_MASK, gamma=0.95, scale="group", std="unbiased", eps=1e-4)
    assert torch.equal(adv, same)
    for other in ({"gamma": 0.5}, {"std": "population"}, {"eps": 1.0}, {"scale": "none"}):
        assert not torch.allclose(adv, gigpo_advantages(GI_EP, GI_STEP, GI_STATE, GI_MASK, **other)[0]), other
    # state 0 holds 3 real steps (one per episode), state 1 holds 2: mean size 2.5 over the 5 real steps'
    # groups as counted per step: (3 + 3 + 3 + 2 + 2) / 5 = 2.6; no step is alone in its group
    assert m["gigpo/step_group_size_mean"] == pytest.approx(2.6)
    assert m["gigpo/singleton_step_fraction"] == 0.0
    assert "gigpo/step_advantages/mean" in m and m["num_zero_std_groups"] == 0.0


def test_gagpo_defaults_options_metrics_and_message():
    from grpokit.algo.credit import gagpo_advantages

    adv, m = gagpo_advantages(GI_STEP, GI_STATE, GI_MASK, 3)
    same, _ = gagpo_advantages(
        GI_STEP, GI_STATE, GI_MASK, 3, gamma=0.95, lam=0.95, std="unbiased", eps=1e-4, flat_rtol=1e-6
    )
    assert torch.equal(adv, same)
    for other in ({"gamma": 0.5}, {"lam": 0.5}, {"std": "population"}, {"eps": 1.0}):
        assert not torch.allclose(adv, gagpo_advantages(GI_STEP, GI_STATE, GI_MASK, 3, **other)[0]), other
    assert {"frac_reward_zero_std", "num_zero_std_groups", "advantages/mean", "gagpo/value_proxy/mean"} <= set(m)
    assert m["num_zero_std_groups"] == 0.0 and m["frac_reward_zero_std"] == 0.0
    with pytest.raises(ValueError) as e:
        gagpo_advantages(GI_STEP, GI_STATE, GI_MASK, 2)
    assert str(e.value) == "3 episodes do not split into groups of 2"


def test_steps_to_tokens_clamps_turn_ids_into_range():
    from grpokit.algo.credit import steps_to_tokens

    adv_NS = torch.tensor([[1.0, 2.0]])
    # turn ids -1 (padding) and 5 (past the last step) clamp to steps 0 and 1; the mask zeroes tokens
    out = steps_to_tokens(adv_NS, torch.tensor([[-1, 0, 1, 5]]), torch.tensor([[1.0, 1.0, 0.0, 1.0]]))
    assert out.tolist() == [[1.0, 1.0, 0.0, 2.0]]
