"""No escape from zero: what a completion itself causes scores 0 and is counted; only the machine is NaN.

An answer that stalls the math verifier, or a program that tampers with the sandbox's result channel,
used to be an excluded item (a NaN to TRL, an exception from the code rewards): in GRPO an excluded
completion gets no advantage while a wrong one gets a negative one, so a policy unsure of its answer
was paid for stalling the checker. Each case here scores 0.0, as a wrong answer, directly (TRL's
convention: floats or None) and through RewardRunner (counted by kind), on a cold pool and beside a
CPU hog, while correct answers keep their 1.0.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from grpokit.rewards.calls import collecting_faults
from grpokit.rewards.math import MathVerifyPool, math_accuracy
from grpokit.rewards.runner import RewardRunner
from grpokit.rewards.spec import RewardSpec
from helpers.verifier_answers import SLOW_ANSWER

FRAC = "1"
for _ in range(300):
    FRAC = rf"\frac{{1}}{{{FRAC}}}"
# (answer, kind): the pathological answers, each for gold 6
PATHOLOGICAL = [
    (r"\boxed{10^{10^{10}}}", "limits"),
    (r"\boxed{9^{9^{9^{9^{9}}}}}", "limits"),
    (r"\boxed{" + FRAC + "}", "limits"),  # 300 nested fractions
    (r"\boxed{" + "9" * 1_000_000 + "}", "limits"),  # a 1 MB number
    (r"\boxed{2^{2^{2^{2^{2^{2}}}}}}", "limits"),
    (r"\boxed{(10^{10})!}", "limits"),
    (r"\boxed{(10!)!}", "limits"),
    (r"\boxed{10^{100000000}}", "limits"),
    (r"\boxed{" + "(" * 500 + "1" + ")" * 500 + "}", "limits"),
]
CORRECT = [(r"\boxed{6}", 1.0), ("<answer>6</answer>", 1.0), (r"so \boxed{\frac{12}{2}}", 1.0)]


def test_pathological_answers_score_zero_directly_and_correct_ones_one(fresh_math_pool):
    answers = [a for a, _ in PATHOLOGICAL] + [a for a, _ in CORRECT]
    with collecting_faults() as faults:
        out = math_accuracy(answers, answer=["6"] * len(answers))
    assert out == [0.0] * len(PATHOLOGICAL) + [1.0] * len(CORRECT)
    assert all(type(v) is float for v in out)  # plain floats: never an ItemFailure (a NaN) to TRL
    assert {i: k for i, (k, _) in faults.items()} == {i: k for i, (_, k) in enumerate(PATHOLOGICAL)}
    assert math_accuracy(answers[:2], answer=["6", "6"]) == [0.0, 0.0]  # no collector: still floats


def test_a_verification_out_of_budget_is_a_counted_zero_and_the_budget_is_cpu_time():
    with MathVerifyPool(timeout_s=0.5) as pool, collecting_faults() as faults:
        assert pool.verify(["6", "6"], [SLOW_ANSWER, r"\boxed{6}"]) == [0.0, 1.0]
    assert pool.timeouts == 1 and faults[0][0] == "timeouts" and "CPU-second" in faults[0][1]


def test_sixteen_pathological_answers_do_not_hold_up_the_correct_one(fresh_math_pool):
    # one verifier worker, one group of 17: 16 pathological answers then a correct one (34 s before;
    # a group call past reward.timeout_s would have failed the correct answer with the rest)
    patho = [PATHOLOGICAL[i % len(PATHOLOGICAL)][0] for i in range(15)] + [SLOW_ANSWER]
    completions = patho + [r"\boxed{6}"]
    with RewardRunner([RewardSpec(math_accuracy, "math_accuracy")], num_workers=0, timeout_s=30) as runner:
        start = time.monotonic()
        res = runner.score(["p"] * 17, completions, [[1]] * 17, 17, {"answer": ["6"] * 17})
        took = time.monotonic() - start
    m = res.metrics
    assert res.total_N.tolist() == [0.0] * 16 + [1.0]
    assert m["rewards/math_accuracy/failures"] == 0.0 and m["rewards/math_accuracy/zeroed"] == 16.0
    assert m["rewards/math_accuracy/limits"] == 15.0 and m["rewards/math_accuracy/timeouts"] == 1.0
    assert took < 45, took  # 15 refused from the text at once, one budget of 3 CPU seconds (wall: the load)


def _hog(stop) -> None:
    while not stop.is_set():
        pass


@pytest.fixture
def cpu_hog():
    """As many busy processes as CPUs (another job on the machine) for the test's duration."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_hog, args=(stop,), daemon=True) for _ in range(mp.cpu_count())]
    for p in procs:
        p.start()
    yield
    stop.set()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_cold_reward_worker_beside_a_cpu_hog_scores_correct_answers_and_zeros(cpu_hog, workers):
    # issue 48's case: reward.num_workers=1 and reward.timeout_s=2 with a fresh worker whose imports
    # take seconds failed 16 of 16 "timed out after 2 s". The worker's start-up, the reward module's
    # imports and the verifier pool's spawn and warm-up are start-up now, outside the 2 s.
    import grpokit.rewards.math as m

    if workers == 0 and m._default is not None:  # a cold verifier pool in this process too
        m._default.close()
        m._default = None
    completions = [r"\boxed{6}", PATHOLOGICAL[0][0], "<answer>6</answer>", PATHOLOGICAL[2][0]] * 4
    with RewardRunner([RewardSpec(math_accuracy, "math_accuracy")], num_workers=workers, timeout_s=2) as runner:
        res = runner.score(["p"] * 16, completions, [[1]] * 16, 4, {"answer": ["6"] * 16})
    met = res.metrics
    assert res.total_N.tolist() == [1.0, 0.0, 1.0, 0.0] * 4
    assert met["rewards/math_accuracy/failures"] == 0.0 and met["rewards/math_accuracy/limits"] == 8.0
