"""A reward function's one name (rewards/spec.py ``reward_name``, TRL's rule): the name its metrics, its samples
column and grpokit.trl's reward_func_names carry, whichever way the function came in."""

from __future__ import annotations

import functools

import pytest

from grpokit.config.sections import Config
from grpokit.rewards.spec import RewardError, RewardSpec, reward_name


def brevity(completions, scale=1.0, **kwargs):
    return [scale * -len(c) for c in completions]


class Judge:
    def __call__(self, completions, **kwargs):
        return [1.0] * len(completions)


def test_partials_are_unwrapped_and_objects_named_after_their_class():
    assert reward_name(brevity) == "brevity"
    assert reward_name(functools.partial(brevity, scale=2.0)) == "brevity"  # before: "partial" / reward_1
    assert reward_name(functools.partial(functools.partial(brevity), scale=3.0)) == "brevity"  # nested
    assert reward_name(Judge()) == "Judge"  # before: reward_0 in the metrics, "Judge" in reward_func_names
    named = Judge()
    named.__name__ = "judge_v2"  # an object's own __name__ wins, as in TRL (grpokit.trl's reward models set one)
    assert reward_name(named) == "judge_v2"
    assert RewardSpec(fn=functools.partial(brevity, scale=2.0)).name == "brevity"


def test_a_native_runs_passed_functions_get_the_same_names(tmp_path):
    from grpokit.train.reward_setup import reward_specs

    cfg = Config()
    cfg.reward.functions = ["task"]
    cfg.data.dataset = str(tmp_path / "rows.jsonl")  # own data: the passed functions take "task"'s place
    specs = reward_specs(cfg, [Judge(), functools.partial(brevity, scale=2.0)], None)
    assert [s.name for s in specs] == ["Judge", "brevity"]


def test_two_functions_of_one_name_are_refused_saying_how_they_are_named():
    from grpokit.rewards import RewardRunner

    twins = [RewardSpec(functools.partial(brevity, scale=s)) for s in (1.0, 2.0)]
    with pytest.raises(RewardError, match=r"must be unique .*'brevity', 'brevity'.*functools.partial is named after"):
        RewardRunner(twins, num_workers=0)


def test_a_domains_wrapper_carries_its_functions_one_name():
    """data.domains wraps each domain's functions in DomainReward, whose __name__ is what reward_name reads of it:
    the same rule as the function's own. Before, a functools.partial (a built-in given reward.params) or a callable
    object was named "reward" there."""
    from grpokit.data.domains import DomainReward

    assert DomainReward(functools.partial(brevity, scale=2.0), "math").__name__ == "brevity"  # before: "reward"
    assert reward_name(DomainReward(Judge(), "math")) == "Judge"  # before: "reward"
    assert reward_name(DomainReward(brevity, "math")) == "brevity"
