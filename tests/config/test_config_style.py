"""config/style.py: a config file is grpokit's (sections) or TRL's (flat argument names), told by the keys only
one style has; ``env`` and ``optim`` are both styles' names (grpokit's sections; TRL's exported variables and
optimizer name)."""

import pytest

from grpokit.config.base import ConfigError
from grpokit.config.style import config_style

TRL = {"model_name_or_path", "learning_rate", "optim", "max_steps"}  # a few of TRL's argument names


def style(data):
    return config_style(data, lambda: TRL, "config file 'c.yaml'")


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"model_name_or_path": "m", "env": {"TOKENIZERS_PARALLELISM": "false"}}, "trl"),  # docs/TRL.md's example
        ({"model_name_or_path": "m", "optim": "adamw_torch"}, "trl"),  # optim as a string: TRL's
        ({"learning_rate": 1e-6}, "trl"),
        ({"model": {"name_or_path": "m"}, "env": {"name": "x"}}, "grpokit"),  # env beside a section: grpokit's
        ({"optim": {"lr": 0.1}}, "grpokit"),  # optim as a mapping: grpokit's section
        ({"env": {"name": "x"}}, "grpokit"),  # no TRL name at all
        ({"optim": "adamw_torch"}, "grpokit"),  # no TRL name that is no section: grpokit's reader says optim's shape
        ({"trian": {"steps": 2}}, "grpokit"),  # a typo, no TRL name: grpokit's reader refuses the unknown section
        ({}, "grpokit"),
        ("text", "grpokit"),
        (None, "grpokit"),
    ],
)
def test_the_style_is_told_by_the_keys_only_one_style_has(data, expected):
    assert style(data) == expected


def test_trls_names_are_asked_only_for_keys_that_are_no_section():
    def never():
        raise AssertionError("asked")

    assert config_style({"train": {"steps": 2}, "env": {}, "optim": "x"}, never, "f") == "grpokit"


def test_a_file_of_both_styles_is_refused_naming_the_keys_of_each():
    data = {"model": {"name_or_path": "m"}, "optim": {"lr": 0.1}, "env": {}, "learning_rate": 1e-6, "max_steps": 3}
    with pytest.raises(ConfigError) as e:
        style(data)
    said = str(e.value)
    # grpokit's: model and optim (a mapping); env belongs to both; TRL's: learning_rate, max_steps
    assert said.startswith(
        "config file 'c.yaml' mixes grpokit's sections (model, optim) with TRL's flat argument names "
        "(learning_rate, max_steps); write it in one style"
    ), said


def test_trls_names_are_read_once_a_file():
    # three keys that are no section: TRL's names are asked for once (before: once a key, 3 calls), and a file
    # of sections only never asks (the TRL layer's import costs seconds)
    calls = []

    def names():
        calls.append(1)
        return TRL

    assert config_style({"model_name_or_path": "m", "learning_rate": 1e-6, "max_steps": 2}, names, "f") == "trl"
    assert len(calls) == 1
    assert config_style({"model": {"name_or_path": "m"}, "optim": {"lr": 0.1}}, names, "f") == "grpokit"
    assert len(calls) == 1
