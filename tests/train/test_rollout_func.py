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


def per_row(prompt_ids):
    """A rollout_func for 2 prompts x 2 completions with the given ``prompt_ids``."""

    def rollout_func(prompts, trainer):
        comps = [[8, 2], [9, 2], [8, 2], [9, 2]]
        return {"prompt_ids": prompt_ids, "completion_ids": comps, "logprobs": [[0.0] * 2] * 4}

    return rollout_func


def test_each_completion_trains_on_its_own_prompt_when_a_groups_prompts_differ():
    # TRL pads prompt_ids row by row, so completion 1 continues [5, 6, 7], not its group's first prompt [5, 6]
    from grpokit.train.token_batch import make_token_batch

    ro, _ = call_rollout_func(per_row([[5, 6], [5, 6, 7], [7], [7]]), None, PROMPTS, 2, ENDS)
    assert ro.prompt_ids == [[5, 6], [7]] and ro.row_prompt_ids == [[5, 6], [5, 6, 7], [7], [7]]
    batch = make_token_batch(ro, pad_token_id=0)
    # prompts left-padded to the longest (3), completions after them: row 1 has no padding, rows 2-3 two pads
    assert batch.input_ids.tolist() == [[0, 5, 6, 8, 2], [5, 6, 7, 9, 2], [0, 0, 7, 8, 2], [0, 0, 7, 9, 2]]
    assert batch.attention_mask.tolist() == [[0, 1, 1, 1, 1], [1] * 5, [0, 0, 1, 1, 1], [0, 0, 1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 0, 0, 1, 2], [0, 0, 0, 1, 2]]


def test_per_completion_prompts_a_group_shares_are_its_prompt():
    ro, _ = call_rollout_func(per_row([[5, 6], [5, 6], [7], [7]]), None, PROMPTS, 2, ENDS)
    assert ro.prompt_ids == [[5, 6], [7]] and ro.row_prompt_ids is None


def test_rows_kept_by_a_filter_keep_their_own_prompts_and_token_counts():
    from grpokit.trl.round_tokens import sampled_tokens
    from grpokit.types import gather_rows

    ro, _ = call_rollout_func(per_row([[5, 6], [5, 6, 7], [7], [7, 1]]), None, PROMPTS, 2, ENDS)
    kept = ro.rows([1, 3], 1)  # GFPO / DAPO keep row 1 of group 0 and row 3 of group 1
    # one row a group: each group's prompt is that row's own, nothing apart left to keep
    assert kept.prompt_ids == [[5, 6, 7], [7, 1]] and kept.row_prompt_ids is None and kept.prompt_of(1) == [7, 1]
    both = gather_rows([(ro, 0), (ro, 1), (kept, 0), (kept, 1)], 2)
    assert both.prompt_ids == [[5, 6], [5, 6, 7]]  # each group's first row's
    assert both.row_prompt_ids == [[5, 6], [5, 6, 7], [5, 6, 7], [7, 1]]
    # TRL's num_tokens: each row's own prompt (2 + 3 + 1 + 2 = 8) and completion (4 x 2 = 8) tokens
    assert sampled_tokens(ro, [2] * 4)[0] == 16.0


def test_regrouped_rows_take_their_prompts_from_the_rows():
    # groups [[5, 6], [5, 6, 7]] and [[7], [7]]; before, gather_rows kept the caller's group prompts while it
    # copied every row's: rows 1 and 3 as two groups of 1 read prompt_ids [[5, 6], [7]] (group 0's prompt, not
    # row 1's own [5, 6, 7]) beside row_prompt_ids [[5, 6, 7], [7]]
    ro, _ = call_rollout_func(per_row([[5, 6], [5, 6, 7], [7], [7]]), None, PROMPTS, 2, ENDS)
    assert ro.row_prompt_ids == [[5, 6], [5, 6, 7], [7], [7]]
    one_each = ro.rows([1, 3], 1)
    assert one_each.prompt_ids == [[5, 6, 7], [7]] and one_each.row_prompt_ids is None
    # rows 2 and 3 (group 1, whose rows agree on [7]) as one group: no per-row prompts left (before: [[7], [7]])
    agreeing = ro.rows([2, 3], 2)
    assert agreeing.prompt_ids == [[7]] and agreeing.row_prompt_ids is None
    # rows 0 and 1 stay apart: the group's prompt is its first row's, every row keeps its own
    apart = ro.rows([0, 1], 2)
    assert apart.prompt_ids == [[5, 6]] and apart.row_prompt_ids == [[5, 6], [5, 6, 7]]


def test_prompt_ids_neither_per_prompt_nor_per_completion_get_one_sentence():
    with pytest.raises(ConfigError, match=r"^rollout_func returned 3 prompt_ids for 2 prompts x group_size=2; give"):
        call_rollout_func(per_row([[5], [5], [7]]), None, PROMPTS, 2, ENDS)


def test_extra_keys_follow_trls_rule_a_list_per_completion_anything_else_to_every_one():
    # before: list(v) split "ckpt" into ["c", "k", "p", "t"] (4 completions: silently one letter each) and
    # failed on the number 3; TRL gives every row a value that is not a list, the tuple included
    tag = ("a", "b")
    ro, extra = call_rollout_func(
        func(policy_tag="ckpt", version=3, pair=tag, hint=[0.5, 1.5, 2.5, 3.5]), None, PROMPTS, 2, ENDS
    )
    assert extra == {"policy_tag": ["ckpt"] * 4, "version": [3] * 4, "pair": [tag] * 4, "hint": [0.5, 1.5, 2.5, 3.5]}


def test_an_extra_list_of_another_length_gets_one_sentence():
    with pytest.raises(ConfigError, match=r"^rollout_func returned 'hint' as a list of 2 values for 4 completions; a"):
        call_rollout_func(func(hint=[1, 2]), None, PROMPTS, 2, ENDS)
