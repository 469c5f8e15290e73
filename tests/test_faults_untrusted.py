"""Fault suite for untrusted code (issue 26): rewards, tools, environments, servers, verifiers.

Every test here encodes one fault that ended a run (a hang, a crash, a leak) before containment was
a property of the system: the fault must end in a value, a counted failure or one sentence. Limits and
timeouts are short so the whole file stays fast; docs/FAULTS.md lists the guarantees.
"""
import math
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from grpokit.rewards.spec import RewardError, RewardSpec


# ---------------------------------------------------------------------------------------------- rewards

def huge(completions, **kwargs):
    return [1e300] * len(completions)


def infinite_or_nan(completions, **kwargs):
    return [math.inf if c == "a" else math.nan for c in completions]


def exits(completions, **kwargs):
    if "x" in completions:
        sys.exit(3)
    return [1.0] * len(completions)


def interrupts(completions, **kwargs):
    if "x" in completions:
        raise KeyboardInterrupt
    return [1.0] * len(completions)


def raises_system_exit(completions, **kwargs):
    if "x" in completions:
        raise SystemExit("bye")
    return [1.0] * len(completions)


def hangs_on_x(completions, **kwargs):
    if "x" in completions:
        time.sleep(3600)
    return [1.0] * len(completions)


def _batch(completions, group_size=1):
    n = len(completions)
    return dict(prompts=["p"] * n, completions=completions, completion_ids=[[1]] * n, group_size=group_size)


def _runner(fn, name, **kw):
    from grpokit.rewards.runner import RewardRunner

    return RewardRunner([RewardSpec(fn, name)], **{"num_workers": 0, "timeout_s": 1.0, **kw})


def test_reward_of_1e300_inf_or_nan_is_a_counted_failure_not_a_crash():
    # 1e300 is a finite float64 but overflows the float32 rewards tensor (RuntimeError before)
    with _runner(huge, "huge", failure_value=-1.0, max_failure_fraction=1.0) as r:
        res = r.score(**_batch(["a", "b"]))
    assert res.rewards_NF[:, 0].tolist() == [-1.0, -1.0]
    assert res.metrics["rewards/huge/failures"] == 2.0 and res.metrics["rewards/huge/nonfinite"] == 2.0
    with _runner(infinite_or_nan, "inf", max_failure_fraction=1.0) as r:
        res = r.score(**_batch(["a", "b"]))
    assert res.metrics["rewards/inf/nonfinite"] == 2.0 and res.total_N.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("fn", [exits, interrupts, raises_system_exit])
def test_sys_exit_keyboard_interrupt_and_system_exit_in_a_reward_are_contained(fn):
    # before: sys.exit(3) ended the run with exit code 3, KeyboardInterrupt killed it; now completion
    # "x" fails (failure_value 0.0) and "y", "z" score 1.0: 1 failure of 3 < max_failure_fraction 0.5
    with _runner(fn, "r") as r:
        res = r.score(**_batch(["x", "y", "z"]))
    assert res.rewards_NF[:, 0].tolist() == [0.0, 1.0, 1.0]
    assert res.metrics["rewards/r/failures"] == 1.0


def test_sys_exit_in_a_worker_process_is_contained():
    with _runner(exits, "r", num_workers=1, timeout_s=30.0) as r:
        res = r.score(**_batch(["x", "y", "z"]))
    assert res.rewards_NF[:, 0].tolist() == [0.0, 1.0, 1.0]


def test_hanging_reward_in_process_times_out_and_the_process_exits():
    # the default mode (num_workers=0): before, each call was abandoned in a thread the interpreter
    # joined at exit, so the process never ended; now the main-thread deadline stops the call.
    script = textwrap.dedent("""
        import time
        from grpokit.rewards.runner import RewardRunner
        from grpokit.rewards.spec import RewardSpec
        def hang(completions, **kw):
            if "x" in completions:
                time.sleep(3600)
            return [1.0] * len(completions)
        r = RewardRunner([RewardSpec(hang, "hang")], num_workers=0, timeout_s=0.5)
        res = r.score(prompts=["p"] * 3, completions=["x", "y", "z"], completion_ids=[[1]] * 3, group_size=1)
        print(res.metrics["rewards/hang/timeouts"], res.rewards_NF[:, 0].tolist())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "1.0 [0.0, 1.0, 1.0]"


def test_hanging_reward_from_a_helper_thread_leaks_no_threads():
    # off the main thread the deadline is soft, but abandoned calls are capped (MAX_ABANDONED = 4)
    from grpokit.rewards.inproc import MAX_ABANDONED

    box = {}
    with _runner(hangs_on_x, "hang", timeout_s=0.2, max_failure_fraction=1.0) as r:
        def work():
            box["res"] = [r.score(**_batch(["x"] * 5)) for _ in range(4)]  # 20 hanging calls

        before = threading.active_count()
        t = threading.Thread(target=work)
        t.start()
        t.join(60)
    assert not t.is_alive()
    assert box["res"][-1].metrics["rewards/hang/timeouts"] == 5.0
    assert threading.active_count() - before <= MAX_ABANDONED
    assert all(th.daemon for th in threading.enumerate() if th.name.startswith("grpokit-reward"))


def test_too_many_failures_name_the_function_and_the_row():
    with _runner(huge, "huge") as r:
        with pytest.raises(RewardError, match=r"Reward 'huge' failed on 2 of 2 completions.*on completion 0: reward 1e\+300"):
            r.score(**_batch(["a", "b"]))
