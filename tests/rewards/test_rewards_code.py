"""Code and math rewards case by case, through the RewardRunner the trainer uses."""

import shutil

import pytest

from grpokit.rewards import RewardRunner, RewardSpec
from grpokit.rewards.code import code_all_pass, code_pass_fraction, extract_code, strict_equal

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

STDIO = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 7\n", "output": "12\n"}]
CALLS = [{"fn": "add", "args": [1, 2], "expected": 3}, {"fn": "add", "args": [2, 2], "expected": 4}]


def fenced(code):
    return f"Here you go:\n```python\n{code}\n```"


@needs_bwrap
def test_stdin_stdout_cases_pass_fraction_and_all_or_nothing():
    right = fenced("a, b = map(int, input().split())\nprint(a + b)")
    half = fenced("a, b = map(int, input().split())\nprint(3)")  # right on the first case only
    crash = fenced("raise SystemExit(1)")
    no_code = "the answer is 3"
    comps = [right, half, crash, no_code]
    assert code_pass_fraction(comps, test_cases=[STDIO] * 4) == [1.0, 0.5, 0.0, 0.0]
    assert code_all_pass(comps, test_cases=[STDIO] * 4) == [1.0, 0.0, 0.0, 0.0]
    assert code_pass_fraction([right], test_cases=[None]) == [None]  # no cases: not applicable


@needs_bwrap
def test_function_call_cases_compare_types_strictly():
    comps = [
        fenced("def add(a, b):\n    return a + b"),
        fenced("def add(a, b):\n    return float(a + b)"),  # 3.0 is not 3
        fenced("def add(a, b):\n    while True: pass"),
    ]  # timeout -> fails
    assert code_pass_fraction(comps, test_cases=[CALLS] * 3, wall_s=1.0) == [1.0, 0.0, 0.0]
    assert strict_equal(3, 3) and not strict_equal(True, 1) and not strict_equal(1, 1.0)


@needs_bwrap
def test_code_reward_through_the_runner_in_worker_processes():
    specs = [RewardSpec(fn=code_pass_fraction, name="code", weight=1.0)]
    comps = [fenced("a, b = map(int, input().split())\nprint(a + b)"), "no code"]
    with RewardRunner(specs, num_workers=1, timeout_s=30) as runner:
        res = runner.score(["p", "p"], comps, [[1], [1]], 2, {"test_cases": [STDIO, STDIO]})
    assert res.total_N.tolist() == [1.0, 0.0] and res.metrics["rewards/code/failures"] == 0


def test_fences_tagged_python_in_any_common_spelling_hold_the_program():
    """```Python, ```python3, ```py3, ``` python and CRLF line ends scored 0 as "no code block" before."""
    prog = "print(int(input())*2)"
    for fence in ("```python\n", "```Python\n", "```PYTHON3\n", "```py\n", "```py3\n", "``` python\n", "```python \n"):
        assert extract_code(f"{fence}{prog}\n```") == prog + "\n", fence
    assert extract_code(f"```python\r\n{prog}\r\nx = 1\r\n```") == prog + "\nx = 1\n"  # CRLF made LF
    assert extract_code(f"```python\n{prog}\n```\nRun:\n```bash\npython sol.py\n```") == prog + "\n"  # last python
    for other in (f"```\n{prog}\n```", f"```text\n{prog}\n```", f"```pyx\n{prog}\n```", prog):
        assert extract_code(other) is None, other  # untagged or another language: no program


@needs_bwrap
def test_completions_without_a_code_block_are_counted():
    """Rows with test cases are graded: the right program (```Python, CRLF) and a completion without a code
    block; the third row has no cases (None, not graded). rewards/no_code_fraction = 1 / 2 = 0.5."""
    logged = {}
    right = "```Python\r\na, b = map(int, input().split())\r\nprint(a + b)\r\n```"
    scores = code_pass_fraction(
        [right, "the answer is 3", "no code"],
        test_cases=[STDIO, STDIO, None],
        log_metric=lambda name, value: logged.setdefault(name, value),
    )
    assert scores == [1.0, 0.0, None] and logged == {"rewards/no_code_fraction": 0.5}


def test_math_accuracy_through_the_runner():
    specs = [RewardSpec(fn=None, name="math_accuracy", weight=1.0)]
    comps = ["The answer is $\\frac{1}{2}$", "The answer is $0.5$", "The answer is $3$", "no idea"]
    with RewardRunner(specs, num_workers=1, timeout_s=30) as runner:
        res = runner.score(["q"] * 4, comps, [[1]] * 4, 4, {"answer": ["$\\frac{1}{2}$"] * 4})
    # 1/2 and 0.5 are the same number; 3 is wrong; no answer is wrong
    assert res.total_N.tolist() == [1.0, 1.0, 0.0, 0.0]


@needs_bwrap
@pytest.mark.parametrize("where", ["main thread", "helper thread", "worker process"])
def test_programs_that_each_run_to_their_limit_do_not_time_out_the_groups_honest_program(where):
    """One group of 6: five endless loops, then the right program. Each loop is killed at its own wall_s
    (0.5 s); two at a time that is 3 rounds of at least 0.5 s, past reward.timeout_s = 1 s. Before, the
    wait on the sandboxes counted against the group's call: it timed out and all 6 (the right program too)
    were failures. The sandboxes keep their own deadlines (calls.timed_elsewhere): the right program scores
    1.0 and the five loops are zeros counted as ``limits`` (5 of 6: mean 1/6), with no failure."""
    import threading

    loop, right = fenced("while True: pass"), fenced("a, b = map(int, input().split())\nprint(a + b)")
    spec = RewardSpec(name="code_pass_fraction", params={"wall_s": 0.5, "max_parallel": 2})
    box = {}
    with RewardRunner([spec], num_workers=int(where == "worker process"), timeout_s=1.0) as runner:

        def score():
            box["res"] = runner.score(["p"] * 6, [loop] * 5 + [right], [[1]] * 6, 6, {"test_cases": [STDIO] * 6})

        if where == "helper thread":  # the call runs in a daemon thread, its deadline on a ThreadClock
            t = threading.Thread(target=score)
            t.start()
            t.join()
        else:
            score()
    res, name = box["res"], "rewards/code_pass_fraction"
    assert res.total_N.tolist() == [0.0] * 5 + [1.0]
    assert res.metrics[f"{name}/failures"] == 0 and res.metrics[f"{name}/timeouts"] == 0
    assert res.metrics[f"{name}/limits"] == 5 and res.metrics[f"{name}/zeroed"] == 5
