"""Presets carry the update count of their recipe where a source states it, so the settings that define them act
(docs/VARIANTS.md cites each source), and the DAPO preset and variant agree with verl's recipe."""

import pytest

from grpokit.algo.ratio import inert_at_ratio_one
from grpokit.algo.variants import VARIANTS
from grpokit.config import Config, ConfigError, apply_overrides, presets
from grpokit.validation import validate


@pytest.mark.parametrize(
    "name, updates",
    [
        ("dapo", 16),  # verl recipe/dapo/run_dapo_qwen2.5_32b.sh: train_prompt_bsz 512 / train_prompt_mini_bsz 32
        ("gspo", 4),  # GSPO paper v2 sec. 5.1: four minibatches per rollout batch (TRL: steps_per_generation=4)
        ("sapo", 1),  # no citable minibatch count found: left at one update, warned at the start
    ],
)
def test_a_preset_makes_its_recipes_updates_per_sampled_batch(name, updates):
    for paper_scale in (False, True):
        cfg = presets.apply(name, Config(), paper_scale=paper_scale)
        assert cfg.train.updates_per_batch == updates
        validate(cfg)  # 16 x 16 (own scale) and 512 x 16 (paper) completions cut into 16 slices of 16 and 512
    # with several updates a batch the ratio moves, so clip-higher, GSPO's sequence ratio and clip range act
    inert = inert_at_ratio_one(presets.apply(name, Config()).algo, updates)
    assert inert == ([] if updates > 1 else ["algo.objective=sapo"])


def test_the_dapo_preset_and_variant_agree_on_overlong_filtering():
    # verl's DAPO reproduction (and the paper's best run, verl docs/algo/dapo.md FAQ) has no overlong filtering,
    # only the soft overlong punishment; before, the variant set algo.mask_truncated=true and the preset did not
    assert presets.apply("dapo", Config()).algo.mask_truncated is False
    assert not any(o.startswith("algo.mask_truncated") for o in VARIANTS["dapo"][1])
    assert any("overlong_penalty" in o for o in VARIANTS["dapo"][1])


def test_dynamic_sampling_needs_updates_that_cut_every_group_count_evenly():
    # a short batch (the rounds ran out) holds k < P groups: k x G rows cut into u updates for every k only when u | G;
    # before, update_slices dropped the remainder rows (k=3, G=4, u=8: 4 of 12 rows) without a word
    with pytest.raises(ConfigError) as e:
        validate(
            apply_overrides(
                Config(), ["algo.dynamic_sampling=true", "rollout.group_size=4", "train.updates_per_batch=8"]
            )
        )
    assert str(e.value).startswith(
        "train.updates_per_batch=8 must divide rollout.group_size=4 with algo.dynamic_sampling=true"
    )
    validate(
        apply_overrides(Config(), ["algo.dynamic_sampling=true", "rollout.group_size=8", "train.updates_per_batch=8"])
    )


def test_the_dapo_preset_and_variant_judge_groups_by_the_runs_own_reward():
    # DAPO: a group stays when some but not all answers are correct (verl filter_groups.metric=acc), so the
    # preset and the variant judge by "task", the run's own reward, not by the total with the overlong penalty
    assert presets.apply("dapo", Config()).reward.judge == ["task"]
    assert "reward.judge=[task]" in VARIANTS["dapo"][1]
    # reward functions of one's own take "task"'s place there as in reward.functions
    cfg = presets.apply("dapo", apply_overrides(Config(), ["reward.functions=[math_accuracy, 'my.mod:fmt']"]))
    assert cfg.reward.functions == ["math_accuracy", "my.mod:fmt", "overlong_penalty"]
    assert cfg.reward.judge == ["math_accuracy", "my.mod:fmt"]
    # none named (reward.functions=[] beside passed functions): "task" stays, the passed functions at training
    cfg = presets.apply("dapo", apply_overrides(Config(), ["reward.functions=[]"]))
    assert cfg.reward.functions == ["overlong_penalty"] and cfg.reward.judge == ["task"]
    # a value the user gives wins, in either spelling; dynamic sampling off: the preset fills no judge (nothing
    # else reads it there), but a frontier curriculum beside it reads the preset's
    for spelling in ("reward.judge", "algo.dynamic_sampling_on"):
        assert presets.apply("dapo", apply_overrides(Config(), [f"{spelling}=[]"])).reward.judge == []
    cfg = presets.apply("dapo", apply_overrides(Config(), ["algo.dynamic_sampling=false"]))
    assert cfg.reward.judge == []
    validate(cfg)
    cfg = presets.apply("dapo", apply_overrides(Config(), ["algo.dynamic_sampling=false", "data.curriculum=frontier"]))
    assert cfg.reward.judge == ["task"]
    with pytest.raises(ConfigError, match=r"reward.judge=\['task'\] has no effect unless algo.dynamic_sampling"):
        validate(apply_overrides(Config(), ["algo.dynamic_sampling_on=[task]"]))
