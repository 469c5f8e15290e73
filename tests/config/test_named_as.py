"""config.base.named_as: a derived config's errors name the field the user set."""

import pytest

from grpokit.config.base import ConfigError, named_as

FIELDS = {"data.task": "data.domains.d.task", "data.task_params": "data.domains.d.task_params"}


@pytest.mark.parametrize(
    "raised, shown",
    [
        ("data.task='x' is unknown", "data.domains.d.task='x' is unknown"),
        ("data.task_params is for reasoning_gym", "data.domains.d.task_params is for reasoning_gym"),  # the longer name
        ("set data.task_params.size=3", "set data.domains.d.task_params.size=3"),  # a key inside it
        ("data.tasks and my.data.task stay", "data.tasks and my.data.task stay"),  # not a whole field name
    ],
)
def test_a_field_is_renamed_only_as_a_whole_dotted_name(raised, shown):
    with pytest.raises(ConfigError) as e, named_as(FIELDS):
        raise ConfigError(raised)
    assert str(e.value) == shown


def test_other_errors_pass_unchanged():
    with pytest.raises(KeyError), named_as(FIELDS):
        raise KeyError("data.task")
