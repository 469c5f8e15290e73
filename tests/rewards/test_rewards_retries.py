"""A reward call that raised, taken apart (rewards/retries.py): each completion called alone finds the failing
ones, then the others are scored together again, so a value that looks across completions keeps its meaning."""

from __future__ import annotations

import pytest

from grpokit.rewards.spec import RewardSpec

CALLS: list[tuple[int, int]] = []  # (completions, group_size) of every call, in-process


def _batch(completions, group_size):
    n = len(completions)
    return dict(
        prompts=["p"] * n,
        completions=completions,
        completion_ids=[[1] * len(c) for c in completions],
        group_size=group_size,
    )


def relative_length(completions, group_size, log_metric, **kwargs):
    """A completion's length minus the call's mean length; raises on a call holding "bad"."""
    CALLS.append((len(completions), group_size))
    if "bad" in completions:
        raise ValueError("cannot grade bad")
    log_metric("called_with", len(completions))
    mean = sum(len(c) for c in completions) / len(completions)
    return [len(c) - mean for c in completions]


@pytest.mark.parametrize("whole_batch", [False, True])
def test_the_healthy_completions_are_scored_together_again(whole_batch):
    from grpokit.rewards import RewardRunner

    CALLS.clear()
    with RewardRunner([RewardSpec(relative_length, "rel")], num_workers=0, failure_value=-5.0) as runner:
        runner.whole_batch = whole_batch
        res = runner.score(**_batch(["a", "bad", "ccc", "dd"], group_size=4 if not whole_batch else 2))
    # the call of 4 raised; alone: "bad" raises, the others score 0 (each its own mean); together again
    # "a", "ccc", "dd" (lengths 1, 3, 2, mean 2) score -1, 1, 0; "bad" gets failure_value
    assert res.rewards_NF[:, 0].tolist() == [-1.0, -5.0, 1.0, 0.0]
    assert res.metrics["rewards/rel/failures"] == 1.0
    # group_size of the call together: one prompt of G = 4 keeps 3 (group calls); under whole_batch (G = 2)
    # prompt 0 keeps 1 and prompt 1 keeps 2, no grouping to read: 1
    assert CALLS == [(4, 2 if whole_batch else 4), (1, 1), (1, 1), (1, 1), (1, 1), (3, 1 if whole_batch else 3)]
    assert res.metrics["called_with"] == 3.0  # what the scoring call logged, not the calls that found the failure


def relative_fails_on_three(completions, **kwargs):
    if "bad" in completions or len(completions) == 3:
        raise ValueError("no")
    mean = sum(len(c) for c in completions) / len(completions)
    return [len(c) - mean for c in completions]


def raises_together(completions, **kwargs):
    if len(completions) > 1:
        raise ValueError("only one at a time")
    return [float(len(completions[0]))]


def test_each_alone_stands_when_the_call_together_fails_or_when_the_call_raised_only_together():
    from grpokit.rewards import RewardRunner

    with RewardRunner([RewardSpec(relative_fails_on_three, "r")], num_workers=0, failure_value=-5.0) as runner:
        res = runner.score(**_batch(["a", "bad", "ccc", "dd"], group_size=4))
    # together again ("a", "ccc", "dd") raises too: each keeps its value alone, 0; only "bad" failed
    assert res.rewards_NF[:, 0].tolist() == [0.0, -5.0, 0.0, 0.0]
    assert res.metrics["rewards/r/failures"] == 1.0
    with RewardRunner([RewardSpec(raises_together, "t")], num_workers=0) as runner:
        res = runner.score(**_batch(["a", "bb", "ccc", "dddd"], group_size=4))
    # no completion fails alone: the same call again would raise again, so the values alone are the scores
    assert res.rewards_NF[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0] and res.metrics["rewards/t/failures"] == 0.0


def module_relative(completions, **kwargs):
    if "bad" in completions:
        raise ValueError("cannot grade bad")
    mean = sum(len(c) for c in completions) / len(completions)
    return [len(c) - mean for c in completions]


def test_taking_apart_in_worker_processes():
    from grpokit.rewards import RewardRunner

    with RewardRunner([RewardSpec(module_relative, "m")], num_workers=1) as runner:
        res = runner.score(**_batch(["a", "bad", "ccc", "dd", "ee", "ffff"], group_size=3))
    # group 1 ("a", "bad", "ccc") raised: "a" and "ccc" together again (mean 2): -1, 1; "bad" failure_value 0;
    # group 2 ("dd", "ee", "ffff", mean 8/3) scored whole: -2/3, -2/3, 4/3
    assert res.rewards_NF[:, 0].tolist() == pytest.approx([-1.0, 0.0, 1.0, -2 / 3, -2 / 3, 4 / 3])
    assert res.metrics["rewards/m/failures"] == 1.0
