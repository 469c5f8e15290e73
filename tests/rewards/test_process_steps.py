"""The process reward's answer is checked before process supervision trains on it (rewards/process_steps.py)."""

import re
from types import SimpleNamespace

import pytest

from grpokit.config import Config
from grpokit.config.base import ConfigError
from grpokit.config.io import apply_overrides
from grpokit.rewards.errors import RewardError
from grpokit.rewards.process_steps import check_steps, checked
from grpokit.train.build import build_rewards

IDS = [[5] * 4, [5] * 6]  # two completions of 4 and 6 tokens


def test_steps_inside_their_completions_pass_as_numbers():
    # the last token of each completion (3 and 5) is a valid end; ints and floats come back as (int, float)
    assert check_steps([[(1, 1), (3, 0.0)], [(5, 1.0)]], IDS) == [[(1, 1.0), (3, 0.0)], [(5, 1.0)]]
    assert check_steps([[], [(0, 0.5)]], IDS) == [[], [(0, 0.5)]]  # a completion without steps is allowed
    assert check_steps([[(0, 0.0)]], [[]]) == [[(0, 0.0)]]  # an empty completion's one step ends at 0


@pytest.mark.parametrize(
    "steps, message",
    [
        # before: an end past the completion covered every token, a negative one none, while both moved the group's
        # mean and std; a NaN made the whole group's advantages NaN; a list too few or too many was a shape error
        (
            [[(1, 1.0), (4, 0.0)], [(2, 0.0)]],
            "ended step 1 of completion 0 at token 4, outside its 4 tokens; a step ends at an index 0..3",
        ),
        ([[(1, 1.0)], [(-3, 0.0)]], "ended step 0 of completion 1 at token -3, outside its 6 tokens"),
        ([[(1, float("nan"))], [(2, 0.0)]], "gave step 0 of completion 0 the reward nan; return finite numbers"),
        ([[(1.5, 1.0)], [(2, 0.0)]], "gave step 0 of completion 0 as (1.5, 1.0); a step is (end_token, reward)"),
        ([[(1,)], [(2, 0.0)]], "gave step 0 of completion 0 as (1,); a step is (end_token, reward)"),
        ([[(1, 1.0)]], "returned 1 step lists for 2 completions; return one list of (end_token, reward) steps"),
        ({"a": 1}, "returned a dict for 2 completions"),
    ],
)
def test_a_step_outside_its_completion_or_not_a_number_is_refused_naming_it(steps, message):
    with pytest.raises(RewardError, match=re.escape(message)) as e:
        check_steps(steps, IDS)
    assert str(e.value).startswith("reward.process_function ") and "\n" not in str(e.value)


def test_the_trainer_checks_every_answer_of_the_process_function():
    def prm(prompts, completions, completion_ids, **columns):
        return [[(len(ids), 1.0)] for ids in completion_ids]  # one past the last token

    with pytest.raises(RewardError, match="at token 4, outside its 4 tokens"):
        checked(prm)(["q", "q"], ["a", "b"], completion_ids=IDS)


def test_process_supervision_with_a_second_outcome_reward_passed_as_a_callable_is_refused():
    # validation sees reward.functions=[task] only; the passed callable makes two outcome rewards, one unread
    cfg = apply_overrides(Config(), ["algo.advantage=process", "reward.process_function=task"])

    def likes_a(completions, **kw):
        return [1.0] * len(completions)

    with pytest.raises(ConfigError, match=r"2 outcome reward functions \(arithmetic_accuracy, likes_a\)"):
        build_rewards(cfg, [likes_a], SimpleNamespace(factory=None))
