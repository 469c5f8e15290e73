"""A setting of a feature that is off is refused in one sentence naming the feature (the run would train
without what it asks for and exit 0); with the feature on, the same value is accepted."""

import pytest

from grpokit.config import Config, ConfigError, apply_overrides
from grpokit.validation import validate

GOLD = "algo.error_correction_fn=grpokit.data.tasks.arithmetic:format_completion"
CASES = [  # (the setting, the feature that reads it, the sentence)
    (
        "algo.sapo_tau_neg=2.0",
        ["algo.objective=sapo"],
        "algo.sapo_tau_neg=2.0 has no effect unless algo.objective=sapo; set that, or leave it 1.05",
    ),
    (
        "algo.entropy_target=0.1",
        ["algo.entropy_adaptive=true"],
        "algo.entropy_target=0.1 has no effect unless algo.entropy_adaptive=true; set that, or leave it 0.2",
    ),
    (
        "algo.ref_mixup_alpha=0.6",
        ["algo.beta=0.04", "algo.ref_refresh_every=8"],
        "algo.ref_mixup_alpha=0.6 has no effect unless algo.ref_refresh_every > 0; set that, or leave it 1.0",
    ),
    (
        "algo.lambda_lr=0.1",
        ["algo.aggregation=lambda-grpo"],
        "algo.lambda_lr=0.1 has no effect unless algo.aggregation=lambda-grpo; set that, or leave it 0.01",
    ),
    (
        "algo.max_sampling_rounds=8",
        ["algo.dynamic_sampling=true"],
        "algo.max_sampling_rounds=8 has no effect unless algo.dynamic_sampling=true; set that, or leave it 4",
    ),
    (
        "algo.entropy_advantage_max_scale=2.0",
        ["algo.entropy_advantage=true"],
        "algo.entropy_advantage_max_scale=2.0 has no effect unless algo.entropy_advantage=true; set that, or leave "
        "it 0.0",
    ),
    (
        GOLD,
        ["algo.error_correction=gold"],
        "algo.error_correction_fn='grpokit.data.tasks.arithmetic:format_completion' has no effect unless "
        "algo.error_correction is on; set that, or leave it ''",
    ),
    (
        "algo.step_gamma=0.9",
        ["algo.advantage=gigpo"],
        "algo.step_gamma=0.9 has no effect unless algo.advantage=gigpo or algo.advantage=gagpo; set that, or leave "
        "it 0.95",
    ),
    (
        "algo.gae_lambda=0.5",
        ["algo.advantage=gagpo"],
        "algo.gae_lambda=0.5 has no effect unless algo.advantage=gagpo; set that, or leave it 0.95",
    ),
    (
        "algo.gigpo_step_weight=0.5",
        ["algo.advantage=gigpo"],
        "algo.gigpo_step_weight=0.5 has no effect unless algo.advantage=gigpo; set that, or leave it 1.0",
    ),
    (
        "algo.shaping_entropy_weight=0.2",
        ["algo.advantage=grpo_s"],
        "algo.shaping_entropy_weight=0.2 has no effect unless algo.advantage=gtpo or algo.advantage=grpo_s; set "
        "that, or leave it 0.1",
    ),
    (
        "algo.gtpo_normalization=joint",
        ["algo.advantage=gtpo", "algo.aggregation=token-mean"],
        "algo.gtpo_normalization='joint' has no effect unless algo.advantage=gtpo; set that, or leave it 'polarity'",
    ),
    (
        "algo.vespo_neg=[2.0,2.0]",
        ["algo.objective=vespo", "algo.ratio_level=trajectory"],
        "algo.vespo_neg=[2.0, 2.0] has no effect unless algo.objective=vespo; set that, or leave it [3.0, 2.0]",
    ),
    (
        "algo.norm_constant=100",
        ["algo.aggregation=seq-mean-token-sum-norm"],
        "algo.norm_constant=100.0 has no effect unless algo.aggregation=seq-mean-token-sum-norm (Dr. GRPO's constant); "
        "set that, or leave it 0.0",
    ),
    (
        "algo.kl_clamp=10.0",
        ["algo.beta=0.04"],
        "algo.kl_clamp=10.0 has no effect unless algo.beta > 0 (a KL term); set that, or leave it 0.0",
    ),
    # before: accepted with beta=0 and entropy_coef=0, each read by nothing
    (
        "algo.kl_estimator=k1",
        ["algo.beta=0.04"],
        "algo.kl_estimator='k1' has no effect unless algo.beta > 0 (a KL term); set that, or leave it 'k3'",
    ),
    (
        "algo.kl_placement=reward",
        ["algo.beta=0.04"],
        "algo.kl_placement='reward' has no effect unless algo.beta > 0 (a KL term); set that, or leave it 'loss'",
    ),
    (
        "algo.kl_bias_correction=true",
        ["algo.beta=0.04"],
        "algo.kl_bias_correction=True has no effect unless algo.beta > 0 (a KL term); set that, or leave it False",
    ),
    (
        "algo.entropy_aggregation=token-mean",
        ["algo.entropy_coef=0.01"],
        "algo.entropy_aggregation='token-mean' has no effect unless algo.entropy_coef != 0 or "
        "algo.entropy_adaptive=true (an entropy bonus); set that, or leave it 'loss'",
    ),
    # before: with distill_coef=0 the teacher serves algo.beta's KL only, and k3 trained the weights k1 did
    (
        "algo.distill_estimator=k3",
        ["algo.distill_teacher=demo", "algo.distill_coef=0.5"],
        "algo.distill_estimator='k3' has no effect unless algo.distill_coef > 0 with algo.distill_top_k=0 (the "
        "per-token reverse-KL reward it estimates); set that, or leave it 'k1'",
    ),
]


@pytest.mark.parametrize("setting, feature, sentence", CASES, ids=[c[0].split("=")[0] for c in CASES])
def test_a_setting_of_a_feature_that_is_off_is_refused_and_accepted_with_it_on(setting, feature, sentence):
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), [setting]))
    assert str(e.value) == sentence
    validate(apply_overrides(Config(), [*feature, setting]))


def test_grpo_s_does_not_read_gtpo_normalisation():
    """GRPO-S shares GTPO's shaping weights, not its token normalisation."""
    with pytest.raises(
        ConfigError, match=r"^algo.gtpo_normalization='joint' has no effect unless algo.advantage=gtpo;"
    ):
        validate(apply_overrides(Config(), ["algo.advantage=grpo_s", "algo.gtpo_normalization=joint"]))


def test_a_plugin_estimators_own_parameters_are_refused_under_another_estimator(monkeypatch):
    """The table is read from the registry's declarations, so a user's estimator with a params record that names a
    config field joins it: here one reading ``algo.step_gamma`` makes it read under that estimator too."""
    from dataclasses import dataclass

    from grpokit.algo import registry

    @dataclass(frozen=True)
    class Mine:
        step_gamma: float = 0.95

    monkeypatch.setitem(registry.STAGE_SPECS["advantage"], "mine", registry.StageSpec(params=Mine))
    monkeypatch.setitem(registry.ADVANTAGES, "mine", lambda ctx: (ctx.rewards_N, {}))
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), ["algo.step_gamma=0.9"]))
    assert "unless algo.advantage=gigpo or algo.advantage=gagpo or algo.advantage=mine;" in str(e.value)
    validate(apply_overrides(Config(), ["algo.advantage=mine", "algo.step_gamma=0.9"]))


@pytest.mark.parametrize("setting", ["model.lora_alpha=64", "model.lora_dropout=0.1", "model.lora_save=merged"])
def test_lora_settings_without_an_adapter_are_refused(setting):
    """model.lora_rank=0 trains every weight: no adapter reads the LoRA settings."""
    name, value = setting.split("=")
    default = {"lora_alpha": "32.0", "lora_dropout": "0.0", "lora_save": "'adapter'"}[name.split(".")[1]]
    shown = {"64": "64.0", "0.1": "0.1", "merged": "'merged'"}[value]
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), [setting]))
    assert str(e.value) == (
        f"{name}={shown} has no effect with model.lora_rank=0 (full fine-tuning); set model.lora_rank > 0, or leave "
        f"it {default}"
    )
    dropout_on = ["model.disable_dropout=false"] * ("lora_dropout" in name)  # LoRA's dropout is off by default
    validate(apply_overrides(Config(), ["model.lora_rank=8", setting, *dropout_on]))


def test_a_seed_outside_numpys_range_is_one_sentence():
    for seed in (-1, 2**32):
        with pytest.raises(ConfigError, match=rf"^train.seed={seed} must be an integer in \[0, 2\*\*32 - 1\]"):
            validate(apply_overrides(Config(), [f"train.seed={seed}"]))
    validate(apply_overrides(Config(), [f"train.seed={2**32 - 1}"]))


def test_the_ratios_settings_at_one_update_per_batch_are_named_once(caplog):
    """One update per sampled batch computes pi_old by the weights it updates: the ratio is 1 at every update, so
    GSPO's sequence ratio and its clip range give GRPO's gradient. Warned (TRL runs such configs too), not refused."""
    import logging

    from grpokit.algo.ratio import inert_at_ratio_one
    from grpokit.config import presets
    from grpokit.train.engines import warn_ratio_one

    gspo = presets.apply("gspo", apply_overrides(Config(), ["train.updates_per_batch=1"]))  # the preset's 4, undone
    assert inert_at_ratio_one(gspo.algo, 1) == [
        "algo.clip_low=0.0003",
        "algo.clip_high=0.0004",
        "algo.ratio_level=sequence",
    ]
    assert inert_at_ratio_one(gspo.algo, 4) == [] and inert_at_ratio_one(Config().algo, 1) == []
    sapo = apply_overrides(Config(), ["algo.objective=sapo"])
    assert inert_at_ratio_one(sapo.algo, 1) == ["algo.objective=sapo"]
    assert inert_at_ratio_one(apply_overrides(sapo, ["algo.num_iterations=2"]).algo, 1) == []
    masked = apply_overrides(Config(), ["algo.offpolicy_delta=0.001"])
    assert inert_at_ratio_one(masked.algo, 1) == ["algo.offpolicy_delta=0.001"]
    with caplog.at_level(logging.WARNING, logger="grpokit.train"):
        warn_ratio_one(gspo)
    assert caplog.messages == [
        "algo.clip_low=0.0003, algo.clip_high=0.0004, algo.ratio_level=sequence change nothing in this run: with one "
        "update per sampled batch (algo.num_iterations=1, train.updates_per_batch=1) the importance ratio is exactly 1 "
        "at every update; set train.updates_per_batch > 1 (several updates per sampled batch, as PPO trains) or "
        "algo.num_iterations > 1 for them to act"
    ]


def test_a_clip_range_the_objective_does_not_read_is_refused():
    """Found from each objective's declaration (ObjectiveSpec.reads_clip): SAPO's soft gate and VESPO's gamma weight
    clip nothing (``clipped=no_clipping``); CISPO caps its weight at 1 + clip_high only (its clip_low unread).
    Before, VESPO had no rule: algo.clip_high=0.28 trained the same weights as 0.2 and exited 0."""
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), ["algo.objective=sapo", "algo.clip_high=0.28"]))
    assert str(e.value) == (
        "algo.clip_high=0.28 has no effect with algo.objective=sapo (it reads no clip range); use "
        "algo.objective=clip for a clip range, or leave it 0.2"
    )
    vespo = ["algo.objective=vespo", "algo.ratio_level=trajectory"]
    for setting, shown in (("algo.clip_high=0.28", "algo.clip_high=0.28"), ("algo.clip_low=0.1", "algo.clip_low=0.1")):
        with pytest.raises(ConfigError) as e:
            validate(apply_overrides(Config(), [*vespo, setting]))
        assert str(e.value) == (
            f"{shown} has no effect with algo.objective=vespo (it reads no clip range); use "
            "algo.objective=clip for a clip range, or leave it 0.2"
        )
    validate(apply_overrides(Config(), [*vespo, "algo.clip_high=0.2"]))  # the default: nothing asked
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), ["algo.objective=cispo", "algo.clip_low=0.1", "algo.clip_high=4.0"]))
    assert str(e.value) == (
        "algo.clip_low=0.1 has no effect with algo.objective=cispo (it reads algo.clip_high only); use "
        "algo.objective=clip for a clip range, or leave it 0.2"
    )
    validate(apply_overrides(Config(), ["algo.objective=cispo", "algo.clip_high=4.0"]))


def test_a_plugin_objective_that_clips_nothing_is_covered_by_its_declaration(monkeypatch):
    """An objective registered later with ``clipped=no_clipping`` joins the rule with no table to edit; one that
    declares nothing (an undeclared plugin) is taken to read both clip fields, so nothing is refused for it."""
    from grpokit.algo import registry
    from grpokit.algo.settings import no_clipping

    surrogate = lambda ratio_NT, adv_NT, logp_NT, c: ratio_NT * adv_NT  # noqa: E731
    monkeypatch.setitem(registry.OBJECTIVE_SPECS, "smooth", registry.ObjectiveSpec(clipped=no_clipping))
    monkeypatch.setitem(registry.OBJECTIVE_FNS, "smooth", surrogate)
    monkeypatch.setitem(registry.OBJECTIVE_SPECS, "bare", registry.UNDECLARED)
    monkeypatch.setitem(registry.OBJECTIVE_FNS, "bare", surrogate)
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), ["algo.objective=smooth", "algo.clip_low=0.1"]))
    assert str(e.value) == (
        "algo.clip_low=0.1 has no effect with algo.objective=smooth (it reads no clip range); use "
        "algo.objective=clip for a clip range, or leave it 0.2"
    )
    validate(apply_overrides(Config(), ["algo.objective=bare", "algo.clip_low=0.1", "algo.clip_high=0.28"]))


def test_trl_maps_no_epsilon_its_sapo_or_cispo_does_not_read():
    from grpokit.trl.config import GRPOConfig
    from grpokit.trl.mapping import to_config

    sapo = to_config(GRPOConfig("o", loss_type="sapo", epsilon=0.1, epsilon_high=0.3), num_rows=4)
    assert (sapo.algo.objective, sapo.algo.clip_low, sapo.algo.clip_high) == ("sapo", 0.2, 0.2)
    cispo = to_config(GRPOConfig("o", loss_type="cispo", epsilon=0.1, epsilon_high=5.0), num_rows=4)
    assert (cispo.algo.objective, cispo.algo.clip_low, cispo.algo.clip_high) == ("cispo", 0.2, 4.0)
    # TRL's VESPO reads neither epsilon (its loss is -phi(w) A log pi, no clamp): before, epsilon=0.1 became
    # algo.clip_low=0.1, refused now as VESPO reads no clip range
    vespo = to_config(GRPOConfig("o", loss_type="vespo", epsilon=0.1, epsilon_high=0.3), num_rows=4)
    assert (vespo.algo.objective, vespo.algo.clip_low, vespo.algo.clip_high) == ("vespo", 0.2, 0.2)
    validate(vespo)


@pytest.mark.parametrize("preset", ["trl-default", "rloo", "reinforce-pp", "deepseekmath"])
def test_a_preset_fills_a_features_settings_only_where_the_run_has_it(preset):
    """trl-default sets TRL's kl_bias_correction and entropy_aggregation; rloo and reinforce-pp a KL in the reward
    with its estimator. With algo.beta=0 (and no entropy bonus) none of them would be read: the preset leaves them at
    their defaults instead of the run being refused for values the user never gave; with the feature on they fill."""
    from grpokit.config import presets

    bare = presets.apply(preset, apply_overrides(Config(), ["algo.beta=0"]))
    a = bare.algo
    assert (a.kl_estimator, a.kl_placement, a.kl_bias_correction, a.entropy_aggregation) == (
        "k3",
        "loss",
        False,
        "loss",
    )
    validate(bare)
    on = presets.apply(preset, apply_overrides(Config(), ["algo.beta=0.02", "algo.entropy_coef=0.001"]))
    validate(on)
    recipe = presets.load(preset)["algo"]
    for name in ("kl_estimator", "kl_placement", "kl_bias_correction", "entropy_aggregation"):
        if name in recipe:
            assert getattr(on.algo, name) == recipe[name], name


def test_a_preset_leaves_out_the_clip_range_the_chosen_objective_does_not_read():
    """--preset dapo algo.objective=sapo: DAPO's clip_high 0.28 is not read by SAPO's soft gate, so the preset leaves
    both clip fields at their default 0.2 (before: refused for clip_high=0.28, a value the user never gave); its other
    fields still fill (dynamic sampling, token-mean). --preset gspo algo.objective=cispo: CISPO reads clip_high only,
    so GSPO's clip_high 4e-4 fills and its clip_low 3e-4 stays 0.2."""
    from grpokit.config import presets
    from grpokit.validation import unread_rules

    dapo = presets.apply("dapo", apply_overrides(Config(), ["algo.objective=sapo"]), rules=unread_rules())
    a = dapo.algo
    assert (a.clip_low, a.clip_high, a.dynamic_sampling, a.aggregation) == (0.2, 0.2, True, "token-mean")
    validate(dapo)
    gspo = presets.apply("gspo", apply_overrides(Config(), ["algo.objective=cispo"]), rules=unread_rules())
    a = gspo.algo
    assert (a.clip_low, a.clip_high, a.ratio_level) == (0.2, 4.0e-4, "sequence")
    validate(gspo)
    vespo = apply_overrides(Config(), ["algo.objective=vespo", "algo.ratio_level=trajectory"])
    a = presets.apply("dapo", vespo, rules=unread_rules()).algo  # VESPO declared no_clipping: left out too
    assert (a.clip_low, a.clip_high, a.dynamic_sampling) == (0.2, 0.2, True)
    # without the registered objectives' rules (config/algo.py's alone) the preset cannot know: it fills 0.28,
    # and validation then names it
    with pytest.raises(ConfigError, match=r"^algo.clip_high=0.28 has no effect with algo.objective=sapo"):
        validate(presets.apply("dapo", apply_overrides(Config(), ["algo.objective=sapo"])))


def test_a_clip_range_the_user_gives_sapo_under_a_preset_is_still_refused():
    """The preset leaves a field out; a value the user gives it is theirs, and SAPO would not read it."""
    from grpokit.config import presets
    from grpokit.validation import unread_rules

    given = apply_overrides(Config(), ["algo.objective=sapo", "algo.clip_high=0.28"])
    cfg = presets.apply("dapo", given, rules=unread_rules())
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value) == (
        "algo.clip_high=0.28 has no effect with algo.objective=sapo (it reads no clip range); use "
        "algo.objective=clip for a clip range, or leave it 0.2"
    )


@pytest.mark.parametrize(
    "setting, shown",
    [("algo.adv_eps=0.5", "algo.adv_eps=0.5"), ("algo.std=population", "algo.std='population'")],
)
def test_the_std_settings_are_refused_where_no_std_divides(setting, shown):
    """algo.scale=none (Dr. GRPO, RLOO) only centres the rewards: A = r - mean, so neither the std's kind nor the eps
    added to it is read (before: the repro's adv_eps=0.5 std=population trained identical weights). Under
    dr-grpo, a preset whose scale is none, a value the user gives is refused too; the preset's own defaults are not."""
    from grpokit.config import presets

    sentence = (
        f"{shown} has no effect with algo.scale=none (the rewards are only centred, divided by no std); set "
        "algo.scale=group, batch, token_whiten or batch_whiten, or leave it "
    )
    for base in (
        apply_overrides(Config(), ["algo.scale=none", setting]),
        presets.apply("dr-grpo", apply_overrides(Config(), [setting])),
    ):
        with pytest.raises(ConfigError) as e:
            validate(base)
        assert str(e.value).startswith(sentence)
    validate(apply_overrides(Config(), [setting]))  # scale=group divides by the std
    validate(presets.apply("dr-grpo", Config()))
    validate(presets.apply("rloo", Config()))


def test_a_preset_leaves_its_adv_eps_out_of_a_run_that_divides_by_no_std():
    """reinforce-pp sets adv_eps 1e-8 (verl's, inside token_whiten's square root); with the user's algo.scale=none
    it would be read by nothing, so the preset leaves it at the default rather than the run being refused."""
    from grpokit.config import presets

    cfg = presets.apply("reinforce-pp", apply_overrides(Config(), ["algo.scale=none"]))
    assert (cfg.algo.scale, cfg.algo.adv_eps, cfg.algo.kl_placement) == ("none", 1e-4, "reward")
    validate(cfg)


def test_the_distillation_estimator_is_refused_beside_the_top_k_forward_kl():
    """With algo.distill_top_k > 0, distill_coef weighs the forward-KL loss term and the per-token reward (the only
    reader of distill_estimator) is off."""
    top_k = ["algo.distill_teacher=demo", "algo.distill_coef=1.0", "algo.distill_top_k=4"]
    with pytest.raises(ConfigError, match=r"^algo.distill_estimator='k3' has no effect unless algo.distill_coef > 0 "):
        validate(apply_overrides(Config(), [*top_k, "algo.distill_estimator=k3"]))
    validate(apply_overrides(Config(), top_k))
