"""Issue 35, item 3: nothing untrusted can stall training or be silently scored.

Each case failed before: a sandboxed program that wrote a deep record on the result channel and then
defined a correct function earned 0.5; an environment whose reset hung held a run for minutes in
silence; a verifier's cold start or time-out scored correct answers 0 without a word.
"""
from __future__ import annotations

import functools

import pytest

from grpokit.rewards.spec import RewardSpec

TAMPER = """
import os
os.write(3, b"[" * 200000 + b"]" * 200000 + b"\\n")
def f(x):
    return 2 * x
"""
HONEST = "def f(x):\n    return 2 * x\n"
CASES = [{"fn": "f", "args": [1], "expected": 2}, {"fn": "f", "args": [3], "expected": 6}]


def _need_sandbox():
    from grpokit.rewards.code import probe

    ok, why = probe()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable on this host: {why}")


def test_tampering_with_the_result_channel_forfeits_the_reward_in_process():
    # the program: a record nested 200,000 deep, then a correct f; 2 cases. Before, the deep
    # line tainted case 0 only and case 1 passed: 0.5. Now the completion fails as tampering.
    from grpokit.rewards.code import SandboxTampering, code_pass_fraction

    _need_sandbox()
    with pytest.raises(SandboxTampering, match="result channel"):
        code_pass_fraction([f"```python\n{TAMPER}```"], [CASES], wall_s=10)
    assert code_pass_fraction([f"```python\n{HONEST}```"], [CASES], wall_s=10) == [1.0]


@pytest.mark.parametrize("workers", [0, 1])
def test_tampering_is_a_counted_failure_through_the_runner(workers):
    from grpokit.rewards.code import code_pass_fraction
    from grpokit.rewards.runner import RewardRunner

    _need_sandbox()
    fn = functools.partial(code_pass_fraction, wall_s=10)
    with RewardRunner([RewardSpec(fn, "code")], num_workers=workers, timeout_s=60) as runner:
        # one group of 2: the group call fails, each completion is retried alone; only the tamperer fails
        res = runner.score(["p", "p"], [f"```python\n{TAMPER}```", f"```python\n{HONEST}```"], [[1], [1]], 2,
                           {"test_cases": [CASES, CASES]})
    assert res.total_N.tolist() == [0.0, 1.0]
    assert res.metrics["rewards/code/failures"] == 1.0


@pytest.mark.parametrize("program", [
    # neighbours: the honest records written twice; a record for the other case first; a huge channel
    "import os\nos.write(3, b'{\"case\": 0, \"status\": \"ok\", \"value\": 2}\\n')\ndef f(x):\n    return 2 * x\n",
    "import os\nos.write(3, b'{\"case\": 1, \"status\": \"ok\", \"value\": 6}\\n')\ndef f(x):\n    return 2 * x\n",
    "import os\ndef f(x):\n    os.write(3, b' ' * (8 << 20))\n    return 2 * x\n",
    "import os\ndef f(x):\n    os.write(3, b'{\"case\": 0, \"status\"\\n')\n    return 2 * x\n",
])
def test_channel_tampering_neighbours_forfeit(program):
    from grpokit.rewards.code import SandboxTampering, code_pass_fraction

    _need_sandbox()
    with pytest.raises(SandboxTampering):
        code_pass_fraction([f"```python\n{program}```"], [CASES], wall_s=10, memory_mb=512)


# ------------------------------------------------------------------------------------------ verifier

CONTROLS = ([r"so \boxed{5}", "<answer>5</answer>", r"\boxed{\frac{1}{2}}", r"\boxed{2\sqrt{2}}"],
            ["5", "5", "0.5", r"\sqrt{8}"])


def test_the_verifier_is_warm_before_the_first_deadline_runs():
    # a fresh pool with a 1 s deadline per item: without the warm-up, the worker's imports and parser
    # set-up ran inside the first items' deadline and all four correct controls timed out (measured
    # on this machine, load 14: 4 time-outs); warmed at start (outside the deadline) they score 1
    from grpokit.rewards.math import MathVerifyPool

    with MathVerifyPool(timeout_s=1.0) as pool:
        assert pool.verify(CONTROLS[1], CONTROLS[0]) == [1.0, 1.0, 1.0, 1.0]
        assert pool.timeouts == 0


def test_a_verifier_time_out_is_a_counted_failure_not_a_zero():
    # a power tower keeps sympy busy past the deadline: the item is an ItemFailure (NaN to numeric
    # code), and RewardRunner counts it as a failure and a timeout of math_accuracy
    from grpokit.rewards.errors import ItemFailure
    from grpokit.rewards.math import MathVerifyPool, math_accuracy
    from grpokit.rewards.runner import RewardRunner

    tower = r"\boxed{9^{9^{9^{9^{9}}}}}"
    with MathVerifyPool(timeout_s=1.0) as pool:
        out = pool.verify(["6", "5"], [tower, r"\boxed{5}"])
    assert isinstance(out[0], ItemFailure) and out[0].timed_out and out[0] != out[0] and out[1] == 1.0
    with RewardRunner([RewardSpec(math_accuracy, "math_accuracy")], num_workers=0, timeout_s=60) as runner:
        res = runner.score(["p"] * 2, [tower, r"\boxed{5}"], [[1], [1]], 2, {"answer": ["6", "5"]})
    m = res.metrics
    assert res.total_N.tolist() == [0.0, 1.0]
    assert m["rewards/math_accuracy/failures"] == 1.0 and m["rewards/math_accuracy/timeouts"] == 1.0


def test_length_rewards_pass_a_verifier_failure_on():
    # cosine_length and length_penalty read correctness: a NaN is truthy, so before it would have
    # counted as a correct answer; now the failure passes through to the runner
    from grpokit.rewards import length
    from grpokit.rewards.errors import ItemFailure

    fail = ItemFailure("math verification ran past its deadline", True)
    orig = length.correctness
    try:
        length.correctness = lambda completions, kwargs: [fail, 1.0]
        assert length.cosine_length(["a", "b"], [[1], [1]], max_length=4)[0] is fail
        assert length.length_penalty(["a", "b"], [[1], [1, 2]])[0] is fail
    finally:
        length.correctness = orig
