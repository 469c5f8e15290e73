"""RewardRunner: the TRL contract, weighting with None skipped, failure containment, hard timeouts.

Reward functions used by worker processes live at module level (they are pickled by reference). This
module imports torch only inside tests, so spawned workers that import it stay light.
"""

import asyncio
import logging
import math
import time

import pytest

from grpokit.rewards.spec import RewardError, RewardSpec, resolve_reward


def first_or_none(completions, **kwargs):
    # completion "b" is not applicable
    return [None if c == "b" else float(len(c)) for c in completions]


def half(completions, **kwargs):
    return [0.5] * len(completions)


def declared_only(completions, answer, group_size):  # no **kwargs: gets only what it declares
    return [float(a == c) + group_size / 10 for c, a in zip(completions, answer)]


async def async_reward(prompts, completions, completion_ids, **kwargs):
    await asyncio.sleep(0)
    return [float(len(ids)) for ids in completion_ids]


def fails_on_bad(completions, **kwargs):
    if any("bad" in c for c in completions):
        raise ValueError("cannot score a bad completion")
    return [1.0] * len(completions)


def slow_on_slow(completions, **kwargs):
    if any("slow" in c for c in completions):
        while True:  # never returns: only a hard timeout gets us out
            pass
    return [1.0] * len(completions)


def always_fails(completions, **kwargs):
    raise ValueError("cannot score anything")


def _batch(completions, group_size):
    n = len(completions)
    return dict(
        prompts=["p"] * n,
        completions=completions,
        completion_ids=[[1] * (i + 1) for i in range(n)],
        group_size=group_size,
    )


def test_weighted_sum_skips_none_and_reports_metrics():
    from grpokit.rewards import RewardRunner

    specs = [RewardSpec(first_or_none, "len", 1.0), RewardSpec(half, "half", 2.0)]
    with RewardRunner(specs, num_workers=1) as runner:
        res = runner.score(**_batch(["a", "b", "ccc", "dd"], group_size=2))
    # len: [1, None, 3, 2]; half: 0.5 each * weight 2 = 1.0  -> total [2, 1, 4, 3]
    assert res.total_N.tolist() == [2.0, 1.0, 4.0, 3.0]
    assert math.isnan(res.rewards_NF[1, 0].item()) and res.rewards_NF[2, 0].item() == 3.0
    assert res.names == ["len", "half"] and res.weights == [1.0, 2.0]
    assert res.metrics["rewards/len/mean"] == pytest.approx(2.0)  # mean of 1, 3, 2
    assert res.metrics["rewards/len/not_applicable"] == 1.0
    assert res.metrics["rewards/len/failures"] == 0.0 and res.metrics["time/reward"] > 0


def test_completions_no_function_scored_are_counted():
    from grpokit.rewards import RewardRunner

    specs = [RewardSpec(first_or_none, "len"), RewardSpec(first_or_none, "len2"), RewardSpec(fails_on_bad, "ok")]
    with RewardRunner(specs, num_workers=0) as runner:
        res = runner.score(**_batch(["a", "b", "ccc", "dd"], group_size=2))
        only = RewardRunner([RewardSpec(first_or_none, "len")], num_workers=0)
        one = only.score(**_batch(["b", "b", "ccc", "b"], group_size=2))
        only.close()
    # "b": None from len and len2, but ok scored it 1.0: scored by one function, so no completion went unscored
    assert res.metrics["rewards/len/not_applicable"] == 1.0 and res.metrics["rewards/unscored"] == 0.0
    # one function answering None for 3 of 4: those 3 have no reward at all
    assert one.metrics["rewards/unscored"] == 3.0 and one.metrics["rewards/scored"] == 4.0


def test_columns_group_size_and_async_in_process():
    from grpokit.rewards import RewardRunner

    specs = [RewardSpec(declared_only, "eq"), RewardSpec(async_reward, "ids")]
    with RewardRunner(specs, num_workers=0) as runner:
        res = runner.score(**_batch(["x", "y", "z", "w"], group_size=2), columns={"answer": ["x", "x", "z", "z"]})
    # eq: [1, 0, 1, 0] + group_size/10 = 0.2 ; ids: lengths 1..4
    assert res.rewards_NF[:, 0].tolist() == pytest.approx([1.2, 0.2, 1.2, 0.2])
    assert res.rewards_NF[:, 1].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_exception_is_contained_to_the_offending_completion(caplog):
    from grpokit.rewards import RewardRunner

    with caplog.at_level(logging.WARNING, logger="grpokit.rewards"):
        with RewardRunner([RewardSpec(fails_on_bad, "f")], num_workers=1, failure_value=-1.0) as runner:
            res = runner.score(**_batch(["ok", "bad", "ok", "ok"], group_size=2))
    # the group ("ok", "bad") raised; retried one by one, only "bad" fails
    assert res.rewards_NF[:, 0].tolist() == [1.0, -1.0, 1.0, 1.0]
    assert res.metrics["rewards/f/failures"] == 1.0
    assert "cannot score a bad completion" in caplog.text and "'bad'" in caplog.text


def batch_sizes(completions, group_size, **kwargs):
    return [float(len(completions) * 10 + group_size)] * len(completions)


def test_whole_batch_calls_each_function_once_with_every_completion_and_retries_one_by_one():
    from grpokit.rewards import RewardRunner

    with RewardRunner([RewardSpec(batch_sizes, "n"), RewardSpec(fails_on_bad, "f")], num_workers=0) as runner:
        runner.whole_batch = True  # TRL's unit (grpokit.trl): one call of 4 completions, group_size still 2
        res = runner.score(**_batch(["ok", "bad", "ok", "ok"], group_size=2))
    assert res.rewards_NF[:, 0].tolist() == [42.0] * 4
    # the batch call of fails_on_bad raised; retried one completion at a time, only "bad" fails
    assert res.rewards_NF[:, 1].tolist() == [1.0, 0.0, 1.0, 1.0] and res.metrics["rewards/f/failures"] == 1.0


def test_hard_timeout_kills_the_worker_and_later_groups_still_score():
    from grpokit.rewards import RewardRunner

    with RewardRunner([RewardSpec(slow_on_slow, "s")], num_workers=1, timeout_s=1.0, failure_value=-2.0) as runner:
        start = time.monotonic()
        res = runner.score(**_batch(["slow", "a", "b", "c"], group_size=2))
        assert time.monotonic() - start < 12
        # 1 kill; 2 when the loop spent over half its second waiting for a CPU (a loaded machine): a
        # call cut short by the machine's slowness is tried once more before it counts (rewards/pool.py)
        assert runner._pool.restarts in (1, 2)
    assert res.rewards_NF[:, 0].tolist() == [-2.0, -2.0, 1.0, 1.0]  # a timed-out group is not split up
    assert res.metrics["rewards/s/failures"] == 2.0


def test_unpicklable_function_falls_back_to_threads_with_a_logged_reason(caplog):
    from grpokit.rewards import RewardRunner

    with caplog.at_level(logging.WARNING, logger="grpokit.rewards"):
        with RewardRunner(
            [RewardSpec(lambda completions, **kw: [2.0] * len(completions), "lam")], num_workers=1
        ) as runner:
            res = runner.score(**_batch(["a", "b"], group_size=2))
    assert res.total_N.tolist() == [2.0, 2.0]
    assert "cannot be pickled" in caplog.text and "soft" in caplog.text


def test_a_function_set_in_place_scores_from_the_next_batch_under_its_name_and_weight(caplog):
    """grpokit.trl's reward_funcs[i] = fn during training: half (0.5, weight 2) becomes a lambda (3.0), which
    cannot be pickled, so it runs in this process beside the worker; the name and the weight stay."""
    from grpokit.rewards import RewardRunner

    with RewardRunner([RewardSpec(half, "h", weight=2.0)], num_workers=1) as runner:
        assert runner.score(**_batch(["a", "b"], group_size=2)).total_N.tolist() == [1.0, 1.0]  # 2 * 0.5
        with caplog.at_level(logging.WARNING, logger="grpokit.rewards"):
            runner.set_function(0, lambda completions, **kw: [3.0] * len(completions))
        res = runner.score(**_batch(["a", "b"], group_size=2))
    assert res.total_N.tolist() == [6.0, 6.0] and res.names == ["h"]  # 2 * 3.0
    assert "cannot be pickled" in caplog.text


def test_too_many_failures_stop_the_run_with_a_clear_message():
    from grpokit.rewards import RewardRunner

    with RewardRunner([RewardSpec(always_fails, "w")], num_workers=0, max_failure_fraction=0.5) as runner:
        with pytest.raises(
            RewardError, match=r"Reward 'w' failed on 4 of 4 completions.*on completion 0: ValueError: cannot score"
        ):
            runner.score(**_batch(["a", "b", "c", "d"], group_size=2))


_SEEN: list[set] = []


def records_keywords(completions, **kwargs):
    _SEEN.append({"completions", *kwargs})
    return [0.0] * len(completions)


def test_the_reserved_keywords_are_exactly_what_the_runner_passes_beside_the_columns():
    """data/prompts.py refuses a column named like RESERVED_KEYWORDS; this pins the list to what a function
    receives, so a keyword added to the runner or call_reward without listing it fails here."""
    from grpokit.rewards import RewardRunner
    from grpokit.rewards.spec import EPISODE_KEYWORDS, LOGGING_KEYWORDS, RESERVED_KEYWORDS, RUNNER_KEYWORDS

    _SEEN.clear()
    with RewardRunner([RewardSpec(records_keywords, "k")], num_workers=0) as runner:
        runner.score(**_batch(["a", "b"], group_size=2), columns={"answer": ["x", "x"]})
    assert _SEEN == [{"answer", *RUNNER_KEYWORDS, *LOGGING_KEYWORDS}]
    assert set(RESERVED_KEYWORDS) == {*RUNNER_KEYWORDS, *LOGGING_KEYWORDS, *EPISODE_KEYWORDS}
    with RewardRunner([RewardSpec(half, "h")], num_workers=0) as runner:  # columns from outside the loaders
        with pytest.raises(ValueError, match="the column 'log_metric' has the name of a keyword grpokit passes"):
            runner.score(**_batch(["a", "b"], group_size=2), columns={"log_metric": ["x", "x"]})


def test_under_trls_convention_a_function_gets_exactly_the_keywords_trl_passes():
    """TRL's _calculate_rewards passes prompts, completions, completion_ids, trainer_state, log_extra, log_metric
    and the keys of its rows but prompt, completion and completion_ids. Before, a function under grpokit.trl also
    got group_size, and a dataset column named completion (a **kwargs function forwarding them to something
    strict failed under grpokit only)."""
    from grpokit.rewards import RewardRunner

    _SEEN.clear()
    columns = {"answer": ["x", "x"], "completion": ["c", "c"], "prompt": ["p", "p"]}
    with RewardRunner([RewardSpec(records_keywords, "k")], num_workers=0, convention="trl") as runner:
        runner.whole_batch = True  # as grpokit.trl runs it
        runner.score(**_batch(["a", "b"], group_size=2), columns=columns)
    trl = {"answer", "prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra"}
    assert _SEEN == [trl]
    with RewardRunner([RewardSpec(records_keywords, "k")], num_workers=0) as runner:  # grpokit's: every column, G
        runner.score(**_batch(["a", "b"], group_size=2), columns=columns)
    assert _SEEN[1] == trl | {"group_size", "completion", "prompt"}


def test_grpokits_own_group_relative_reward_still_gets_group_size_under_trls_convention():
    import functools

    from grpokit.data.domains import DomainReward
    from grpokit.rewards import RewardRunner
    from grpokit.rewards.length import length_penalty
    from grpokit.rewards.spec import passes_group_size

    batch = dict(_batch(["a", "bbb", "ccccc", "ddddddd"], group_size=2), completion_ids=[[0] * n for n in (1, 3, 5, 7)])
    with RewardRunner([RewardSpec(length_penalty, "kimi")], num_workers=0, convention="trl") as runner:
        runner.whole_batch = True  # one call of all 4 completions: only group_size says where a group ends
        res = runner.score(**batch, columns={"correct": [1, 1, 1, 1]})
    # Kimi's lambda = 0.5 - (L - min) / (max - min) within each group of G = 2: lengths (1, 3) and (5, 7) give
    # 0.5 and -0.5 each. Without group_size the 4 would be one group (min 1, max 7): 0.5, 1/6, -1/6, -0.5.
    assert res.rewards_NF[:, 0].tolist() == [0.5, -0.5, 0.5, -0.5]
    assert passes_group_size(functools.partial(length_penalty, correct=None), "trl")  # a partial of it too
    assert passes_group_size(DomainReward(length_penalty, "d"), "trl")  # a domain's wrapper forwards it
    assert not passes_group_size(DomainReward(half, "d"), "trl") and not passes_group_size(half, "trl")
    assert passes_group_size(half, "grpokit")


def _raises_on_b(completions, **kwargs):
    _SEEN.append({"completions", *kwargs})
    if "b" in completions:
        raise ValueError("b")
    return [1.0] * len(completions)


def test_whether_a_function_gets_group_size_is_decided_per_function_and_follows_set_function():
    """The runner decides once per function whether it gets group_size (rewards/spec.py passes_group_size) and
    again when set_function replaces it (grpokit.trl's reward_funcs[i] = fn); every call of it follows: the group
    call, and the calls a raised call is taken apart into (each completion alone, the healthy ones together)."""
    from grpokit.rewards import RewardRunner
    from grpokit.rewards.spec import reads_group_size

    def marked(completions, **kwargs):
        _SEEN.append({"completions", *kwargs})
        return [0.0] * len(completions)

    reads_group_size(marked)
    _SEEN.clear()
    with RewardRunner([RewardSpec(_raises_on_b, "r")], num_workers=0, convention="trl") as runner:
        runner.score(**_batch(["a", "b", "c", "d"], group_size=4))
        # one group call of a, b, c, d raised; then a, b, c, d alone (b raises); then a, c, d together: 6 calls
        assert len(_SEEN) == 6 and not any("group_size" in seen for seen in _SEEN)
        runner.set_function(0, marked)  # a function that reads group_size takes its place: it gets G = 4
        _SEEN.clear()
        runner.score(**_batch(["a", "b", "c", "d"], group_size=4))
        assert len(_SEEN) == 1 and "group_size" in _SEEN[0]
        runner.set_function(0, _raises_on_b)  # and back: none again
        _SEEN.clear()
        runner.score(**_batch(["a", "b", "c", "d"], group_size=4))
        assert len(_SEEN) == 6 and not any("group_size" in seen for seen in _SEEN)


def test_input_mistakes_get_one_sentence():
    from grpokit.rewards import RewardRunner

    with RewardRunner([RewardSpec(half, "h")], num_workers=0) as runner:
        with pytest.raises(ValueError, match="group_size must divide"):
            runner.score(**_batch(["a", "b", "c"], group_size=2))
        with pytest.raises(ValueError, match="'answer' has 1 entries"):
            runner.score(**_batch(["a", "b"], group_size=2), columns={"answer": ["x"]})


def test_resolve_reward_names_and_paths():
    assert resolve_reward("strict_format").__name__ == "strict_format"
    assert resolve_reward("test_rewards_runner:half") is half
    bound = resolve_reward("overlong_penalty", max_length=8, cache_length=4)
    assert bound(["x"], completion_ids=[[0] * 6]) == [-0.5]
    with pytest.raises(RewardError, match=r"Unknown reward 'nope'.*math_accuracy.*package.module:function"):
        resolve_reward("nope")
    with pytest.raises(RewardError, match="has no callable named 'missing'"):
        resolve_reward("grpokit.rewards.format:missing")
    assert RewardSpec(name="tag_count", weight=0.5).fn.__name__ == "tag_count"
