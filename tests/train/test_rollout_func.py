"""train/rollout_func.py: TRL's rollout_func dict as a Rollout, its finish reasons given or read from
each completion's last token (TRL's rule)."""

import pytest

from grpokit.config import ConfigError
from grpokit.train.rollout_func import call_rollout_func
from grpokit.types import Prompt

PROMPTS = [Prompt("p", [5, 6]), Prompt("q", [7])]
ENDS = frozenset({2, 0})  # EOS 2, pad 0


def func(**extra):
    """A rollout_func for 2 prompts x 2 completions of 3 tokens: rows 0 and 2 end on EOS 2, rows 1 and 3 do not."""

    def rollout_func(prompts, trainer):
        comps = [[8, 9, 2], [8, 9, 10], [9, 2, 2], [9, 10, 11]]
        return {"prompt_ids": [[5, 6], [7]], "completion_ids": comps, "logprobs": [[0.0] * 3] * 4, **extra}

    return rollout_func


def test_without_finish_reasons_a_completion_not_ending_on_eos_or_pad_was_cut():
    # all four are 3 tokens long: the old rule ("eos" for every row) called none of them cut; TRL's
    # last-token rule cuts rows 1 and 3, whose last tokens 10 and 11 are neither EOS (2) nor pad (0)
    ro, extra = call_rollout_func(func(), None, PROMPTS, 2, ENDS)
    assert ro.finish_reasons == ["eos", "length", "eos", "length"]
    assert extra == {} and ro.prompt_ids == [[5, 6], [7]]


def test_given_finish_reasons_are_kept_and_do_not_reach_the_reward_functions():
    reasons = ["stop", "length", "eos", "eos"]
    ro, extra = call_rollout_func(func(finish_reasons=reasons), None, PROMPTS, 2, ENDS)
    assert ro.finish_reasons == reasons and "finish_reasons" not in extra


@pytest.mark.parametrize(
    "reasons, message",
    [
        (["eos"] * 3, r"^rollout_func returned 3 finish_reasons for 4 completions; give one per completion"),
        (["eos", "abort", "eos", "eos"], r"^rollout_func returned finish_reasons \['abort'\]; each must be one of eos"),
    ],
)
def test_wrong_finish_reasons_get_one_sentence(reasons, message):
    with pytest.raises(ConfigError, match=message):
        call_rollout_func(func(finish_reasons=reasons), None, PROMPTS, 2, ENDS)
