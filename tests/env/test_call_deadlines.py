"""Deadlines measure the call, for every kind of worker: start-up a call marks as such
(grpokit.rewards.calls.startup: imports, a pool's spawn and warm-up, a probe) never counts against it.

Each kind runs a call that spends 1.5 s in start-up and then answers, under a 0.5 s deadline: it
answers. The control spends the same 1.5 s outside start-up and is cut at its deadline.
"""

from __future__ import annotations

import threading
import time

import pytest

from grpokit.env.calls import call_many
from grpokit.env.tools import call_tool
from grpokit.rewards.calls import startup
from grpokit.rewards.runner import RewardRunner
from grpokit.rewards.spec import RewardSpec


def slow_start(seconds: float = 1.5) -> str:
    with startup():
        time.sleep(seconds)
    return "ready"


def slow_work(seconds: float = 1.5) -> str:
    time.sleep(seconds)
    return "ready"


def test_environment_calls_leave_start_up_out_of_their_deadline():
    key = f"test-startup-{time.monotonic_ns()}"
    outs = call_many(key, [slow_start, slow_work], timeout_s=0.5)
    assert outs[0].ok and outs[0].value == "ready"
    assert outs[1].timed_out


def test_tool_calls_leave_start_up_out_of_their_deadline():
    tools = {"slow_start": lambda: slow_start(), "slow_work": lambda: slow_work()}
    assert call_tool(tools, "slow_start", {}, timeout_s=0.5, max_chars=100).content == "ready"
    assert call_tool(tools, "slow_work", {}, timeout_s=0.5, max_chars=100).timed_out


def warm_reward(completions, **kwargs):
    with startup():  # e.g. a reward model loaded on the first call
        time.sleep(1.5)
    return [1.0] * len(completions)


def cold_reward(completions, **kwargs):
    time.sleep(1.5)
    return [1.0] * len(completions)


@pytest.mark.parametrize("mode", ["main thread", "helper thread", "worker"])
def test_reward_calls_leave_start_up_out_of_their_deadline(mode):
    specs = [RewardSpec(warm_reward, "warm"), RewardSpec(cold_reward, "cold")]
    batch = dict(prompts=["p"] * 2, completions=["a", "b"], completion_ids=[[1], [1]], group_size=2)
    with RewardRunner(specs, num_workers=int(mode == "worker"), timeout_s=1.0, max_failure_fraction=1.0) as runner:
        if mode == "helper thread":
            box = []
            t = threading.Thread(target=lambda: box.append(runner.score(**batch)))
            t.start()
            t.join()
            res = box[0]
        else:
            res = runner.score(**batch)
    m = res.metrics
    assert m["rewards/warm/failures"] == 0.0 and m["rewards/warm/mean"] == 1.0
    assert m["rewards/cold/failures"] == 2.0 and m["rewards/cold/timeouts"] == 2.0
