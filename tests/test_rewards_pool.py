"""Shared worker pools under concurrent callers, failures that cannot hide, and a prompt exit.

Functions run by spawned workers live at module level (they are pickled by reference).
"""
import threading
import time

import pytest

from grpokit.rewards.pool import WorkerPool


def echo(tag, i):
    time.sleep(0.002 * (i % 3))  # uneven durations so that replies interleave
    return (tag, i)


def _hammer(run_one, callers: int, items: int) -> list[str]:
    """Run `run_one(tag, items)` from `callers` threads at once; return every wrong mapping seen."""
    wrong: list[str] = []
    barrier = threading.Barrier(callers)

    def caller(tag: int) -> None:
        barrier.wait()
        for _ in range(3):
            got = run_one(tag, items)
            wrong.extend(f"caller {tag} item {i}: got {g!r}" for i, g in enumerate(got) if g != (tag, i))

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return wrong


def test_worker_pool_results_go_to_the_caller_that_asked():
    # 4 threads share one 2-worker pool; each sends 12 tasks tagged with its own id, three times.
    # Every reply must come back to its own caller, at its own position: (tag, i).
    with WorkerPool(2) as pool:
        def run_one(tag, items):
            outcomes = pool.run([(echo, (tag, i), {}) for i in range(items)], timeout_s=20)
            return [o.value if o.ok else o.error for o in outcomes]

        assert _hammer(run_one, callers=4, items=12) == []


def test_math_pool_shared_by_threaded_rewards_scores_every_completion_itself():
    # The bug of issue 19: two unpicklable rewards (lambdas run in the runner's threads) share the
    # process-wide math-verify pool. 24 completions in 12 groups of 2; completion i answers i when i is
    # even (1.0) and i + 100 when odd (0.0), so a reward delivered to the wrong completion shows.
    from grpokit.rewards import RewardRunner, RewardSpec
    from grpokit.rewards.math import math_accuracy

    n = 24
    golds = [str(i) for i in range(n)]
    completions = [f"so $\\boxed{{{i if i % 2 == 0 else i + 100}}}$" for i in range(n)]
    specs = [RewardSpec(lambda completions, **kw: math_accuracy(completions, **kw), "a"),
             RewardSpec(lambda completions, answer, **kw: math_accuracy(completions, answer=answer), "b")]
    with RewardRunner(specs, num_workers=2, timeout_s=60) as runner:
        res = runner.score(["p"] * n, completions, [[1]] * n, group_size=2, columns={"answer": golds})
    expected = [1.0 if i % 2 == 0 else 0.0 for i in range(n)]
    assert res.rewards_NF[:, 0].tolist() == expected
    assert res.rewards_NF[:, 1].tolist() == expected
