"""What a reward function may return (rewards/spec.py ``as_values``): any iterable of one number (or None) per
completion, as TRL takes it; anything else, a wrong count above all, stops the run in one sentence naming the
function, what it returned and for how many completions, and is never retried one completion at a time.

Functions used by worker processes live at module level (pickled by reference)."""

from __future__ import annotations

import math

import pytest

from grpokit.rewards.spec import RewardError, RewardSpec, as_values

CALLS: list[int] = []  # completions per call, for the in-process tests


def _batch(completions, group_size, prompts=None):
    n = len(completions)
    return dict(
        prompts=prompts or ["p"] * n,
        completions=completions,
        completion_ids=[[1] * len(c) for c in completions],
        group_size=group_size,
    )


def numpy_lengths(completions, **kwargs):
    import numpy as np

    return np.array([float(len(c)) for c in completions])


def tensor_lengths(completions, **kwargs):
    import torch

    return torch.tensor([float(len(c)) for c in completions])


def generated_lengths(completions, **kwargs):
    return (float(len(c)) for c in completions)


def tuple_lengths(completions, **kwargs):
    return tuple(float(len(c)) for c in completions)


@pytest.mark.parametrize("fn", [numpy_lengths, tensor_lengths, generated_lengths, tuple_lengths])
@pytest.mark.parametrize("workers", [0, 1])
def test_any_iterable_of_one_value_per_completion_is_taken(fn, workers):
    from grpokit.rewards import RewardRunner

    with RewardRunner([RewardSpec(fn, "len")], num_workers=workers) as runner:
        res = runner.score(**_batch(["a", "bb", "ccc", "dddd"], group_size=2))
    # lengths 1..4, each its own value; nothing failed
    assert res.rewards_NF[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert res.metrics["rewards/len/failures"] == 0.0


def per_prompt(prompts, completions, **kwargs):
    """The classic mistake: one value per distinct prompt, not per completion."""
    CALLS.append(len(completions))
    return [float(len(p)) for p in dict.fromkeys(prompts)]


@pytest.mark.parametrize("whole_batch", [False, True])
def test_a_wrong_count_stops_the_run_at_the_first_call_and_is_never_retried(whole_batch):
    from grpokit.rewards import RewardRunner

    CALLS.clear()
    with RewardRunner([RewardSpec(per_prompt, "pp")], num_workers=0) as runner:
        runner.whole_batch = whole_batch
        # two prompts, G = 2: a group call returns 1 value for 2 completions, the batch call 2 for 4
        want = "returned 2 values for 4 completions" if whole_batch else "returned 1 values for 2 completions"
        with pytest.raises(RewardError, match=rf"^Reward 'pp' {want}; a reward function returns one number"):
            runner.score(**_batch(["a", "b", "c", "d"], group_size=2, prompts=["p0", "p0", "p1", "p1"]))
    assert CALLS == ([4] if whole_batch else [2, 2])  # the calls as made, none of one completion after them


def empty_alone(completions, **kwargs):
    """Raises on a call with "bad" in it, and returns nothing for a call of one good completion."""
    if "bad" in completions:
        raise ValueError("bad one")
    return [] if len(completions) == 1 else [1.0] * len(completions)


def test_a_wrong_count_of_a_completion_called_alone_says_what_the_call_was():
    from grpokit.rewards import RewardRunner

    with RewardRunner([RewardSpec(empty_alone, "e")], num_workers=0) as runner:
        with pytest.raises(
            RewardError,
            match=r"^Reward 'e' returned 0 values for 1 completions \(completion 0 called alone after the call of "
            r"its 2 completions raised ValueError: bad one\)",
        ):
            runner.score(**_batch(["ok", "bad"], group_size=2))


def text_reward(completions, **kwargs):
    return "1.0"


def matrix_reward(completions, **kwargs):
    import numpy as np

    return np.ones((len(completions), 1))


def none_reward(completions, **kwargs):
    return None


def mapping_reward(completions, **kwargs):
    return {c: 1.0 for c in completions}


@pytest.mark.parametrize(
    "fn, said",
    [
        (text_reward, "returned a str, not a list of one value per completion"),
        (matrix_reward, r"returned an array of shape \(2, 1\); return one value per completion \(a 1-D array\)"),
        (none_reward, "returned None, not a list"),
        (mapping_reward, "returned a dict, not a list"),
    ],
)
def test_a_return_that_is_not_one_value_per_completion_is_named(fn, said):
    from grpokit.rewards import RewardRunner

    with RewardRunner([RewardSpec(fn, "f")], num_workers=0) as runner:
        with pytest.raises(RewardError, match=rf"^Reward 'f' {said}"):
            runner.score(**_batch(["a", "b"], group_size=2))


def test_as_values_by_hand():
    import numpy as np
    import torch

    assert as_values(np.array([1.5, 2.0]), 2) == [1.5, 2.0]
    assert as_values(torch.tensor([True, False]), 2) == [True, False]  # bools are read as 1.0 / 0.0 later
    assert as_values(iter([None, 3]), None) == [None, 3]
    with pytest.raises(TypeError, match=r"returned an array of shape \(\)"):
        as_values(np.float32(1.0), 1)  # a numpy scalar is no list of values
    with pytest.raises(TypeError, match="returned a set"):
        as_values({1.0}, 1)  # no order of completions
    with pytest.raises(TypeError, match="returned 3 values for 2 completions"):
        as_values([1, 2, 3], 2)


def nan_among_values(completions, **kwargs):
    import numpy as np

    return [1.0, float("nan"), np.float32("nan"), float("inf"), 3.0]


def all_nan(completions, **kwargs):
    return [float("nan")] * len(completions)


def index(completions, **kwargs):
    return [float(i) for i in range(len(completions))]


def test_a_nan_is_none_under_trls_convention_and_a_failure_under_grpokits():
    from grpokit.rewards import RewardRunner

    batch = _batch(["a", "b", "c", "d", "e"], group_size=5)
    kw = dict(num_workers=0, failure_value=-1.0, max_failure_fraction=1.0)
    with RewardRunner([RewardSpec(nan_among_values, "f")], convention="trl", **kw) as runner:
        trl = runner.score(**batch)
    # TRL fills None with NaN and skips every NaN: both NaNs (a float's and numpy's) are "not applicable"; the
    # infinity is still a failure (failure_value -1). Values 1, 3 scored: mean 2, population std 1
    assert (
        trl.rewards_NF[:, 0].tolist()[0::3] == [1.0, -1.0] and trl.rewards_NF[:, 0].isnan().tolist()[1:3] == [True] * 2
    )
    assert trl.total_N.tolist() == [1.0, 0.0, 0.0, -1.0, 3.0]  # a NaN is left out of the sum, the failure counts
    assert trl.metrics["rewards/f/not_applicable"] == 2.0 and trl.metrics["rewards/f/failures"] == 1.0
    assert trl.metrics["rewards/f/nonfinite"] == 1.0 and trl.metrics["rewards/unscored"] == 2.0
    assert trl.metrics["rewards/f/mean"] == 2.0 and trl.metrics["rewards/f/std"] == 1.0
    with RewardRunner([RewardSpec(nan_among_values, "f")], **kw) as runner:
        own = runner.score(**batch)
    # grpokit's convention (docs/REWARDS.md): NaN, like an infinity, is the function's failure
    assert own.rewards_NF[:, 0].tolist() == [1.0, -1.0, -1.0, -1.0, 3.0]
    assert own.metrics["rewards/f/failures"] == 3.0 and own.metrics["rewards/f/nonfinite"] == 3.0
    assert own.metrics["rewards/f/not_applicable"] == 0.0


def test_a_function_nan_for_the_whole_batch_does_not_stop_a_trl_convention_run():
    from grpokit.rewards import RewardRunner

    specs = [RewardSpec(all_nan, "nan"), RewardSpec(index, "i")]
    batch = _batch(["a", "b", "c", "d"], group_size=2)
    with RewardRunner(specs, num_workers=0, convention="trl") as runner:
        res = runner.score(**batch)
    # "nan" applies to none: the totals are the other function's 0, 1 in each group (TRL's nansum), none failed
    assert res.total_N.tolist() == [0.0, 1.0, 0.0, 1.0] and res.metrics["rewards/failed_fraction"] == 0.0
    assert res.metrics["rewards/nan/not_applicable"] == 4.0 and math.isnan(res.metrics["rewards/nan/mean"])
    with RewardRunner(specs, num_workers=0) as runner:  # grpokit's: 4 of 4 failed, more than 0.5
        with pytest.raises(RewardError, match=r"^Reward 'nan' failed on 4 of 4 completions.*reward is nan"):
            runner.score(**batch)
