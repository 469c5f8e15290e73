"""Shared worker pools under concurrent callers, failures that cannot hide, and a prompt exit.

Functions run by spawned workers live at module level (they are pickled by reference).
"""

import threading
import time

import pytest

from grpokit.rewards.pool import WorkerPool
from helpers.paths import ROOT


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
            try:
                got = run_one(tag, items)
            except Exception as exc:  # a caller that raised is a failure too, not a thread that vanished
                wrong.append(f"caller {tag} raised {type(exc).__name__}: {exc}")
                return
            wrong.extend(f"caller {tag} item {i}: got {g!r}" for i, g in enumerate(got) if g != (tag, i))
            if len(got) != items:
                wrong.append(f"caller {tag}: {len(got)} results for {items} items")

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
    # Two unpicklable rewards (lambdas run in the runner's threads) share the
    # process-wide math-verify pool. 24 completions in 12 groups of 2; completion i answers i when i is
    # even (1.0) and i + 100 when odd (0.0), so a reward delivered to the wrong completion shows.
    from grpokit.rewards import RewardRunner, RewardSpec
    from grpokit.rewards.math import math_accuracy

    n = 24
    golds = [str(i) for i in range(n)]
    completions = [f"so $\\boxed{{{i if i % 2 == 0 else i + 100}}}$" for i in range(n)]
    specs = [
        RewardSpec(lambda completions, **kw: math_accuracy(completions, **kw), "a"),
        RewardSpec(lambda completions, answer, **kw: math_accuracy(completions, answer=answer), "b"),
    ]
    with RewardRunner(specs, num_workers=2, timeout_s=60) as runner:
        res = runner.score(["p"] * n, completions, [[1]] * n, group_size=2, columns={"answer": golds})
    expected = [1.0 if i % 2 == 0 else 0.0 for i in range(n)]
    assert res.rewards_NF[:, 0].tolist() == expected
    assert res.rewards_NF[:, 1].tolist() == expected


def own_number(completions, **kwargs):
    """A picklable reward (runs in the runner's worker processes): each completion's own number."""
    time.sleep(0.001 * (len(completions[0]) % 3))  # uneven durations so that replies interleave
    return [float(c) for c in completions]


def test_reward_workers_shared_by_concurrent_score_calls_score_every_completion_itself():
    # 3 threads call score() on one runner at once (2 worker processes shared), three times each, with
    # a picklable reward (worker processes) and a lambda (the runner's threads). Caller t's completion i
    # is the number 1000 t + i, so every reward must equal its own completion's number.
    from grpokit.rewards import RewardRunner, RewardSpec

    n = 16
    specs = [
        RewardSpec(own_number, "workers"),
        RewardSpec(lambda completions, **kw: [-float(c) for c in completions], "threads"),
    ]
    with RewardRunner(specs, num_workers=2, timeout_s=60) as runner:

        def run_one(tag, items):
            comps = [str(1000 * tag + i) for i in range(items)]
            res = runner.score(["p"] * items, comps, [[1]] * items, group_size=2)
            return [
                (round(a / 1000), int(a) % 1000) if a == -b else ("mismatch", a, b) for a, b in res.rewards_NF.tolist()
            ]

        assert _hammer(run_one, callers=3, items=n) == []


CODE_PROGRAM = "```python\ndef f(i):\n    return i if i < %d else -1\n```"


def test_code_rewards_called_from_concurrent_threads_score_every_completion_itself():
    # 3 reward threads call code_pass_fraction at once (each runs 2 sandboxes at a time). Caller t's
    # completion i passes exactly p = 3 t + i + 1 of 12 cases (f(k) = k for k < p), so its reward
    # p / 12 names the completion it belongs to: 1/12, 2/12 ... 12/12, all different.
    import shutil

    from grpokit.rewards.code import code_pass_fraction, probe

    if shutil.which("bwrap") is None or not probe()[0]:
        pytest.skip("sandbox isolation unavailable on this host")
    cases = [{"fn": "f", "args": [k], "expected": k} for k in range(12)]

    def run_one(tag, items):
        comps = [CODE_PROGRAM % (3 * tag + i + 1) for i in range(items)]
        scores = code_pass_fraction(comps, [cases] * items, wall_s=10.0, max_parallel=2)
        return [divmod(round(12 * s) - 1, 3) for s in scores]  # back to (tag, i)

    assert _hammer(run_one, callers=4, items=3) == []


def die(code):
    import os

    os._exit(code)


def broken_machinery(completions, **kwargs):
    from grpokit.rewards.errors import RewardInfrastructureError

    raise RewardInfrastructureError("the verifier service is gone; restart it")


def nonfinite(completions, **kwargs):
    # one value per completion: a number, NaN, +inf, -inf, a number
    return [1.0, float("nan"), float("inf"), float("-inf"), 3.0][: len(completions)]


def test_one_worker_death_is_contained_but_repeated_deaths_stop_the_run():
    from grpokit.rewards.errors import RewardInfrastructureError

    with WorkerPool(1, name="test", max_deaths_in_a_row=3) as pool:
        # die, ok, die, ok, then each dying task once more (a worker may die of the machine's doing, so a
        # task is retried once after the others): never 3 deaths in a row -> each is that task's failure
        out = pool.run([(die, (7,), {}), (echo, ("t", 0), {}), (die, (7,), {}), (echo, ("t", 1), {})], timeout_s=20)
        assert [o.ok for o in out] == [False, True, False, True]
        assert "worker process died (exit code 7) twice" in out[0].error and out[0].kind == "crashes"
        assert pool.restarts == 4
        with pytest.raises(
            RewardInfrastructureError,
            match=r"The test worker processes died on 3 tasks in a row "
            r"\(last exit code 7\).*dmesg",
        ):
            pool.run([(die, (7,), {})] * 4, timeout_s=20)
        assert pool.run([(echo, ("t", 2), {})], timeout_s=20)[0].value == ("t", 2)  # the pool still works


def test_infrastructure_errors_stop_the_runner_in_workers_and_in_threads():
    from grpokit.rewards import RewardRunner, RewardSpec
    from grpokit.rewards.errors import RewardInfrastructureError

    batch = dict(prompts=["p"] * 2, completions=["a", "b"], completion_ids=[[1], [2]], group_size=1)
    for workers in (1, 0):  # 1: the function runs in a worker process; 0: in a thread of this process
        with RewardRunner([RewardSpec(broken_machinery, "svc")], num_workers=workers, max_failure_fraction=1.0) as r:
            with pytest.raises(RewardInfrastructureError, match="Reward 'svc' cannot be computed: .*restart it"):
                r.score(**batch)


def test_math_verify_import_error_is_one_sentence(monkeypatch):
    import sys

    from grpokit.rewards.errors import RewardInfrastructureError
    from grpokit.rewards.math import MathVerifyPool

    monkeypatch.setitem(sys.modules, "math_verify", None)  # `import math_verify` now raises ImportError
    with pytest.raises(RewardInfrastructureError, match=r"math-verify could not be imported .*pip install"):
        MathVerifyPool()


def test_nan_and_inf_rewards_are_counted_and_never_summed_in():
    from grpokit.rewards import RewardRunner, RewardSpec

    n = 5
    with RewardRunner([RewardSpec(nonfinite, "nf")], num_workers=0, failure_value=0.0, max_failure_fraction=1.0) as r:
        res = r.score(["p"] * n, ["c"] * n, [[1]] * n, group_size=n)
    # NaN, inf, -inf are failures: they get failure_value 0.0, and the mean is over 1.0 and 3.0 only = 2.0
    assert res.rewards_NF[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0, 3.0]
    assert res.metrics["rewards/nf/mean"] == 2.0
    assert res.metrics["rewards/nf/nonfinite"] == 3.0 and res.metrics["rewards/nf/failures"] == 3.0
    assert res.metrics["rewards/failed_fraction"] == 3 / 5
    assert res.metrics["reward"] == pytest.approx(4.0 / 5)  # total (1 + 0 + 0 + 0 + 3) / 5: finite


def _run_script(tmp_path, body: str, timeout: float = 120):
    import os
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(body)
    src = str(ROOT / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.run(
            [sys.executable, str(script)], stdout=out, stderr=err, cwd=tmp_path, env=env, timeout=timeout
        )  # raises TimeoutExpired if the script hangs at exit
    return proc.returncode, (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()


def test_a_script_using_math_accuracy_exits_promptly_with_output_to_a_file(tmp_path):
    # Without the pool's exit hook this would hang at interpreter exit: multiprocessing joins the idle workers.
    code, out, err = _run_script(
        tmp_path,
        (
            "from grpokit.rewards.math import math_accuracy\n"
            "if __name__ == '__main__':\n"
            "    print(math_accuracy(['so \\\\boxed{2}', '<answer>5</answer>'], answer=['2', '3']))\n"
        ),
        timeout=60,
    )
    assert code == 0, err
    assert out.strip() == "[1.0, 0.0]"


def test_a_script_without_main_guard_gets_one_clear_error_not_zeros(tmp_path):
    code, out, err = _run_script(
        tmp_path,
        ("from grpokit.rewards.math import math_accuracy\nprint(math_accuracy(['\\\\boxed{2}'], answer=['2']))\n"),
        timeout=60,
    )
    assert code != 0 and out == ""  # no fabricated [0.0]
    assert "RewardInfrastructureError: The math-verify worker process exited with code 1 before it was ready" in err
    assert 'if __name__ == "__main__":' in err


def test_a_worker_that_does_not_start_once_is_replaced_and_the_call_runs(tmp_path, monkeypatch):
    # the machine's failure (a worker stalled in its start-up) costs one fresh worker, not the run
    from grpokit.rewards.pool import WorkerPool
    from helpers.pool_workers import stall_the_first_start

    monkeypatch.setenv("GRPOKIT_TEST_STALL_FLAG", str(tmp_path / "stalled"))
    with WorkerPool(1, initializer=stall_the_first_start, start_timeout_s=3.0) as pool:
        (out,) = pool.run([(abs, (-2,), {})], timeout_s=5.0)
        assert out.ok and out.value == 2 and pool.restarts == 1
    assert (tmp_path / "stalled").exists()


def test_a_sandbox_without_isolation_stops_the_runner_instead_of_scoring_zeros(monkeypatch):
    import grpokit.rewards.code as code
    from grpokit.rewards import RewardRunner, RewardSpec
    from grpokit.rewards.errors import RewardInfrastructureError

    monkeypatch.setattr(code, "probe", lambda: (False, "sees host processes"))
    cases = [{"input": "1\n", "output": "1\n"}] * 2
    with RewardRunner([RewardSpec(code.code_pass_fraction, "code")], num_workers=0, max_failure_fraction=1.0) as r:
        with pytest.raises(RewardInfrastructureError, match="sees host processes"):
            r.score(["p"] * 2, ["```python\nprint(1)\n```"] * 2, [[1]] * 2, 2, {"test_cases": cases})


def test_a_pool_created_in_a_thread_outlives_the_thread_and_an_idle_death_is_replaced():
    # Linux's parent-death signal follows the *thread* that started a child: a pool first used from a
    # reward-runner thread used to lose its workers when that thread ended, and the next call then
    # failed with BrokenPipeError and left the pool without workers (later calls hung).
    made = []
    t = threading.Thread(target=lambda: made.append(WorkerPool(1, name="test")))
    t.start()
    t.join()
    pool = made[0]
    try:
        time.sleep(0.5)  # time for a parent-death signal to land, if one were sent
        assert pool.run([(echo, ("t", 0), {})], timeout_s=20)[0].value == ("t", 0)
        pool._idle[0].proc.kill()  # an idle worker dies (OOM killer, a stray signal)
        pool._idle[0].proc.join()
        assert pool.run([(echo, ("t", 1), {})], timeout_s=20)[0].value == ("t", 1)  # replaced, not lost
    finally:
        pool.close()
