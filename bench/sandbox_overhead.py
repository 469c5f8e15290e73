"""Per-call overhead of the code sandbox: median and p90 over N honest calls.

Usage: PYTHONPATH=src python bench/sandbox_overhead.py [N] [--polling] [--rlimit]
Times one honest stdin/stdout program per call, alone (one call at a time) and 4 calls in parallel
(latency of each call while 3 others run), against a bare `python -I -S` run of the same program.
--polling swaps the pidfd wait for Popen.wait(timeout) polling, to measure what polling costs;
--rlimit holds the per-sandbox budget with the rlimit fallback instead of a cgroup (what a host
without a writable cgroup pays). The budget mechanism in use is printed.
"""

import concurrent.futures as cf
import subprocess
import sys

import grpokit.rewards.sandbox.isolation as iso
from grpokit.rewards.code import probe, run_tests
from grpokit.rewards.sandbox import budget
from timing import seconds, spread

CODE = "a, b = map(int, input().split())\nprint(a + b)"
CASES = [{"input": "1 2\n", "output": "3\n"}]


def polling_wait(proc, timeout):
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def timed(fn) -> float:
    return seconds(fn)[0] * 1e3


def stats(ms) -> str:
    s = spread(ms)
    return f"median {s['median']:6.1f} ms  p90 {s['p90']:6.1f} ms  (n={s['n']})"


def main():
    n = int(next((a for a in sys.argv[1:] if a.isdigit()), 100))
    if "--polling" in sys.argv:
        iso.wait_exit = polling_wait
    if "--rlimit" in sys.argv:
        budget.mechanism = lambda: None
    print("isolation:", probe(), "budget:", budget.mechanism() or "rlimit")
    bare = [
        timed(
            lambda: subprocess.run(
                [sys.executable, "-I", "-S", "-c", CODE], input=b"1 2\n", capture_output=True, check=True
            )
        )
        for _ in range(n)
    ]

    def one():
        assert run_tests(CODE, CASES) == [True]

    alone = [timed(one) for _ in range(n)]
    with cf.ThreadPoolExecutor(4) as ex:
        parallel = list(ex.map(lambda _: timed(one), range(n)))
    print("bare python      ", stats(bare))
    print("sandbox, alone   ", stats(alone))
    print("sandbox, 4 at once", stats(parallel))
    print("overhead (median, alone): %.1f ms" % (spread(alone)["median"] - spread(bare)["median"]))


if __name__ == "__main__":
    main()
