"""The fields that once chose an advantage estimator beside algo.advantage (config/retired.py)."""

import pytest

from grpokit.config import Config, ConfigError, apply_overrides, from_dict


@pytest.mark.parametrize(
    "field, value", [("algo.supervision", "process"), ("algo.credit", "gagpo"), ("algo.entropy_shaping", "grpo_s")]
)
def test_a_retired_field_that_chooses_is_refused_naming_the_one_spelling(field, value):
    with pytest.raises(ConfigError) as e:
        apply_overrides(Config(), [f"{field}={value}"])
    assert str(e.value) == (
        f"{field}={value!r} is no longer a field: algo.advantage alone chooses the advantage estimator; "
        f"write algo.advantage={value} instead (docs/VARIANTS.md)"
    )


def test_an_older_saved_config_with_the_neutral_values_still_loads():
    # every config.yaml written before the fields were folded carries them at these values
    cfg = from_dict({"algo": {"supervision": "outcome", "credit": "outcome", "entropy_shaping": "none", "beta": 0.1}})
    assert cfg.algo.advantage == "group" and cfg.algo.beta == 0.1
    assert not hasattr(cfg.algo, "credit")


def test_an_unknown_field_is_still_unknown():
    with pytest.raises(ConfigError, match="unknown config field 'algo.credits'"):
        apply_overrides(Config(), ["algo.credits=gigpo"])


def test_one_layer_giving_both_spellings_of_the_judge_is_refused_and_a_later_layer_wins(tmp_path):
    """algo.dynamic_sampling_on is reward.judge's other spelling. Before, a file (or one command line) giving both
    kept whichever came last without a word: [task] then [overlong_penalty] loaded ['overlong_penalty']. Within one
    layer it is refused now; a later layer (the command line after the file) still wins, in either spelling."""
    from grpokit.config.io import load_yaml

    sentence = "algo.dynamic_sampling_on is reward.judge's other spelling; give only reward.judge"
    both = tmp_path / "both.yaml"
    both.write_text(
        "algo: {dynamic_sampling: true, dynamic_sampling_on: [task]}\nreward: {judge: [overlong_penalty]}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_yaml(both)
    assert str(e.value) == f"config file {str(both)!r} gives both algo.dynamic_sampling_on and reward.judge: {sentence}"
    for overrides in (
        ["algo.dynamic_sampling_on=[task]", "reward.judge=[overlong_penalty]"],
        ["reward.judge=[overlong_penalty]", "algo.dynamic_sampling_on=[task]"],  # either order
    ):
        with pytest.raises(ConfigError) as e:
            apply_overrides(Config(), overrides)
        assert str(e.value) == f"the command line gives both algo.dynamic_sampling_on and reward.judge: {sentence}"
    with pytest.raises(ConfigError, match="^the config gives both"):
        from_dict({"algo": {"dynamic_sampling_on": ["task"]}, "reward": {"judge": ["task"]}})
    # a layer each: the later wins, whichever spelling each uses
    old = tmp_path / "old.yaml"
    old.write_text("algo: {dynamic_sampling: true, dynamic_sampling_on: [task]}\n")
    assert apply_overrides(load_yaml(old), ["reward.judge=[overlong_penalty]"]).reward.judge == ["overlong_penalty"]
    new = tmp_path / "new.yaml"
    new.write_text("algo: {dynamic_sampling: true}\nreward: {judge: [task]}\n")
    assert apply_overrides(load_yaml(new), ["algo.dynamic_sampling_on=[x]"]).reward.judge == ["x"]
