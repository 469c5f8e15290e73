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
