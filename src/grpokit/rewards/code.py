"""Code-execution rewards: run the model's Python against test cases in the sandbox.

The program is the last fenced block of the completion tagged python, python3, py or py3 (any case,
spaces allowed after the backticks, CRLF line ends too: ```Python and ```python3 programs scored 0 as "no
code block" before). Test cases come from a
`test_cases` column (a list of dicts, or a JSON string of one), all of one kind:
- stdin/stdout: {"input": "1 2\\n", "output": "3\\n"}; outputs match when equal after removing trailing
  whitespace on every line and trailing blank lines;
- function call: {"fn": "add", "args": [1, 2], "expected": 3}; the sandbox returns the value as plain
  JSON (exact None/bool/int/float/str/list/dict types, tuples as lists, no subclasses) and the parent
  compares strictly: same types (True is not 1, 1 is not 1.0), floats within 1e-9 (relative or absolute).

Rewards: code_pass_fraction = passed / number of cases; code_all_pass = 1.0 iff every case passes.
No code block -> 0.0, and the share of such completions is logged as ``rewards/no_code_fraction`` (through
``log_metric``); no `test_cases` for a row -> None (not applicable). A program that tampers with the
result channel scores 0.0 whatever its cases returned, reported as ``tampering`` (grpokit.rewards.calls):
to a direct caller (TRL) it is a plain 0.0, never an exception that would drop it from its group. A
program that runs past its limits fails the cases it did not finish, and is counted as ``limits``.
Each program keeps its own deadline (``wall_s``, after its sandbox's start-up budget), so the wait on
the group's sandboxes is not the reward call's time (grpokit.rewards.calls.timed_elsewhere): a group of
endless loops, each killed at its ``wall_s``, cannot time out the call and fail its right program too.

Verdicts are made here, by the trusted parent: expected outputs never enter the sandbox and a program
can only report its own outputs (see sandbox/harness.py). Before the first run we `probe()` the host's
isolation, and that one resource budget per sandbox (memory, tasks, CPU of the whole tree) can hold on
this host (sandbox/budget.py); without both, code rewards refuse to run unless
`allow_unsafe_code_execution=True` (then only rlimits, an empty environment and the wall-clock kill
apply: the program can read your files and use your network).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import re
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from grpokit.rewards.sandbox.isolation import Limits, parse_records, run_sandboxed

from .calls import report_fault, startup, timed_elsewhere
from .errors import RewardInfrastructureError
from .math import completion_text
from .sandbox import budget

HARNESS = (Path(__file__).parent / "sandbox" / "harness.py").read_text()
_FENCE = re.compile(r"```[ \t]*(?:python3?|py3?)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
_PROGRAM = ["{python}", "-I", "-S", "{job}/harness.py", "{job}", "{scratch}"]


class SandboxTampering(ValueError):
    """A program wrote on the sandbox's result channel itself (raised by ``run_tests``): the code rewards
    score the completion 0.0 whatever its cases returned, and report it as ``tampering``."""


class UnsafeCodeExecutionError(RewardInfrastructureError):
    """Code rewards were asked to run on a host where the sandbox does not isolate (stops the run)."""


def extract_code(text: str) -> str | None:
    """The last fenced block tagged python / python3 / py / py3 (any case), with CRLF line ends made LF, or
    None when there is none (an untagged or other-language block is not the program)."""
    blocks = _FENCE.findall(text)
    return blocks[-1].replace("\r\n", "\n") if blocks else None


_PROBE = r"""
import json, os, socket
r = {"uid": os.getuid(), "env": sorted(os.environ), "root": sorted(os.listdir("/")),
     "nets": sorted(n for _, n in socket.if_nameindex())}
# In its own PID namespace the probe sees only bwrap's init (1) and itself. (Signalling the trainer's
# pid instead misfires when that number exists inside too: a trainer that is PID 1 of a container.)
others = {int(p) for p in os.listdir("/proc") if p.isdigit()} - {1, os.getpid()}
r["sees_parent"] = bool(others)
os.write(3, (json.dumps({"case": 0, **r}) + "\n").encode())
"""


@lru_cache(maxsize=1)
def probe() -> tuple[bool, str]:
    """Check once per process that the sandbox isolates on this host; returns (works, reason)."""
    if not os.path.exists("/usr/bin/bwrap") and not any(
        os.path.exists(os.path.join(d, "bwrap")) for d in os.environ.get("PATH", "").split(":")
    ):
        return False, "bubblewrap (bwrap) is not installed (run scripts/install_sandbox_deps.sh)"
    res = run_sandboxed({"probe.py": _PROBE}, ["{python}", "-I", "-S", "{job}/probe.py"], Limits(wall_s=10))
    if not res.records:
        return False, f"the sandbox did not start (exit {res.returncode}): {res.stderr.strip()[:300]}"
    r = res.records[0]
    problems = []
    if r["uid"] == 0:
        problems.append("runs as root")
    if r["sees_parent"]:
        problems.append("sees host processes")
    if set(r["nets"]) - {"lo"}:
        problems.append(f"has network interfaces {r['nets']}")
    if set(r["env"]) - {"PWD", "LC_CTYPE"}:
        problems.append(f"inherits environment variables {r['env']}")
    if {"home", "etc", "root"} & set(r["root"]):
        problems.append(f"sees host folders {r['root']}")
    return (not problems, "isolation works" if not problems else "; ".join(problems))


def require_isolation(allow_unsafe_code_execution: bool, limits: Limits = Limits()) -> bool:
    """True when sandboxed runs are isolated and one budget per sandbox holds (sandbox/budget.py);
    raise unless the user explicitly allowed unsafe runs (then False: rlimits per process only)."""
    ok, reason = probe()
    if ok:
        try:
            budget.plan(limits.memory_bytes, limits.processes, limits.cpus, limits.budget)
            return True
        except budget.BudgetError as exc:
            if allow_unsafe_code_execution:
                return False
            raise UnsafeCodeExecutionError(
                f"{str(exc).rstrip('.')}, or set allow_unsafe_code_execution=True "
                "to run untrusted code with rlimits only."
            ) from None
    if allow_unsafe_code_execution:
        return False
    raise UnsafeCodeExecutionError(
        f"Code rewards need a working sandbox, but on this host it {reason}; fix that, or set "
        "allow_unsafe_code_execution=True to run untrusted code with rlimits only."
    )


def parse_cases(raw: Any) -> tuple[str, list[Any], list[Any]]:
    """(mode, inputs, expected) from a row's test cases; mode is "stdio" or "call"."""
    cases = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(cases, list) or not cases or not all(isinstance(c, dict) for c in cases):
        raise ValueError("test_cases must be a non-empty list of dicts (or a JSON string of one).")
    if all({"input", "output"} <= set(c) for c in cases):
        return "stdio", [str(c["input"]) for c in cases], [str(c["output"]) for c in cases]
    if all({"fn", "args", "expected"} <= set(c) and isinstance(c["args"], list) for c in cases):
        return "call", [{"fn": c["fn"], "args": c["args"]} for c in cases], [c["expected"] for c in cases]
    raise ValueError(
        'each test case must be {"input", "output"} (stdin/stdout) or {"fn", "args": [...], '
        '"expected"} (function call), all of one kind.'
    )


def _norm(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def strict_equal(actual: Any, expected: Any) -> bool:
    """Plain-JSON equality with exact types; floats within 1e-9; tuples in `expected` count as lists."""
    if isinstance(expected, tuple):
        expected = list(expected)
    if type(actual) is not type(expected):
        return False
    if type(actual) is float:
        return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-9)
    if type(actual) is list:
        return len(actual) == len(expected) and all(strict_equal(a, e) for a, e in zip(actual, expected))
    if type(actual) is dict:
        return actual.keys() == expected.keys() and all(strict_equal(actual[k], expected[k]) for k in actual)
    return actual == expected


def run_tests(
    code: str,
    test_cases: Any,
    limits: Limits = Limits(),
    allow_unsafe_code_execution: bool = False,
    cancel: threading.Event | None = None,
    notes: list[str] | None = None,
) -> list[bool]:
    """Run `code` on every case in one sandbox; one pass/fail per case, decided here. ``notes``, when
    given, gets one line when the program ran past its limits (killed at ``wall_s``, or a case timed out)."""
    isolated = require_isolation(allow_unsafe_code_execution, limits)
    mode, inputs, expected = parse_cases(test_cases)
    job = {"mode": mode, "inputs": inputs, "case_timeout_s": limits.wall_s, "max_output_bytes": limits.max_output_bytes}
    files = {"solution.py": code, "job.json": json.dumps(job), "harness.py": HARNESS}
    try:
        result = run_sandboxed(files, _PROGRAM, limits, isolated=isolated, cancel=cancel)
    except budget.BudgetError as exc:  # e.g. a cgroup that could not be created: stop, never score 0
        raise UnsafeCodeExecutionError(str(exc)) from None
    if notes is not None and (result.timed_out or any(r.get("status") == "timeout" for r in result.records)):
        notes.append(f"the program ran past its limits (wall_s={limits.wall_s:g} s)")
    records, tampered = _trusted_records(result.channel, len(expected))
    if mode == "call" and (tampered or result.channel_overflow):  # the program shares the harness's process
        raise SandboxTampering(
            "the program wrote on the sandbox's result channel (a line the harness did not write"
            + (", or more than the parent reads" if result.channel_overflow else "")
            + "); tampering forfeits the reward"
        )
    passed = [False] * len(expected)
    for i, rec in records.items():
        try:  # records are bounded in size and depth (sandbox/isolation.py); anything odd fails the case
            if mode == "stdio":
                passed[i] = type(rec.get("stdout")) is str and _norm(rec["stdout"]) == _norm(expected[i])
            else:
                passed[i] = "value" in rec and strict_equal(rec["value"], expected[i])
        except Exception:
            passed[i] = False
    return passed


def _trusted_records(channel: str, n: int) -> tuple[dict[int, dict], bool]:
    """(case -> its "ok" record, tampered): the records of a channel the harness alone wrote.

    The harness writes exactly one line per case, in case order; in call mode the program runs in the
    harness's process and can write on the channel too. Any line that is not a well-formed record in
    sequence (blank, malformed, too deep, a second record of a case, a case out of order or out of range, a
    record after the last case) is tampering: no record of that channel is trusted (``run_tests``
    raises ``SandboxTampering``, so the completion fails and is counted, whatever the cases said)."""
    accepted: dict[int, dict] = {}
    expected_next = 0
    for line in channel.splitlines():  # a blank line too: the harness never writes one
        records = parse_records(line)
        rec = records[0] if records else None
        if rec is None or rec["case"] != expected_next or expected_next >= n:
            return {}, True
        accepted[expected_next] = rec
        expected_next += 1
    return {i: r for i, r in accepted.items() if r.get("status") == "ok"}, False


def _scores(
    completions: list[Any],
    test_cases: list[Any] | None,
    all_or_nothing: bool,
    limits: Limits,
    allow_unsafe: bool,
    max_parallel: int,
    log_metric: Any = None,
) -> list[float | None]:
    if test_cases is None:
        raise ValueError("code rewards need a 'test_cases' column.")

    def one(code: str | None, cases: Any) -> tuple[float | None, tuple[str, str] | None]:
        if cases is None:
            return None, None
        if code is None:
            return 0.0, None
        notes: list[str] = []
        try:
            passed = run_tests(code, cases, limits, allow_unsafe, cancel, notes)
        except SandboxTampering as exc:  # the completion's own doing: 0, as a wrong program, and counted
            return 0.0, ("tampering", str(exc))
        score = float(all(passed)) if all_or_nothing else sum(passed) / len(passed)
        return score, ("limits", notes[0]) if notes else None  # its timed-out cases failed; counted

    with startup():  # the host's isolation probe (once per process) is start-up, not this call's work
        require_isolation(allow_unsafe, limits)  # refuse before running anything
    programs = [extract_code(completion_text(c)) for c in completions]  # the call's own work, on its clock
    cancel = threading.Event()
    ex = cf.ThreadPoolExecutor(max_workers=max_parallel)  # threads only wait on sandboxes
    try:
        # Each program holds its own deadline (wall_s, after its sandbox's start-up budget): waiting on
        # them is not the calling reward's time, so programs that each run to their limit cannot
        # together time out the group's call and fail its honest program with them (calls.timed_elsewhere).
        with timed_elsewhere():
            results = list(ex.map(one, programs, test_cases))
    finally:  # interrupted (the trainer stopping): stop the sandboxes now, not at their wall-clock limit
        cancel.set()
        ex.shutdown(wait=True, cancel_futures=True)
    for i, (_, fault) in enumerate(results):  # reported from the calling thread, where the call's record is
        if fault is not None:
            report_fault(i, *fault)
    graded = [code for code, cases in zip(programs, test_cases) if cases is not None]
    if log_metric is not None and graded:  # scored 0 for want of a program, not for a wrong one
        log_metric("rewards/no_code_fraction", sum(code is None for code in graded) / len(graded))
    return [score for score, _ in results]


def _limits(wall_s: float, memory_mb: int) -> Limits:
    """A program's limits: ``wall_s`` of wall clock, as many whole CPU seconds (at least 1), ``memory_mb``."""
    return Limits(wall_s=wall_s, cpu_s=max(1, math.ceil(wall_s)), memory_bytes=memory_mb * 2**20)


def code_pass_fraction(
    completions: list[Any],
    test_cases: list[Any] | None = None,
    wall_s: float = 2.0,
    memory_mb: int = 512,
    allow_unsafe_code_execution: bool = False,
    max_parallel: int = 2,
    **kwargs: Any,
) -> list[float | None]:
    """Fraction of test cases the completion's program passes (see the module docstring)."""
    limits = _limits(wall_s, memory_mb)
    log = kwargs.get("log_metric")
    return _scores(completions, test_cases, False, limits, allow_unsafe_code_execution, max_parallel, log)


def code_all_pass(
    completions: list[Any],
    test_cases: list[Any] | None = None,
    wall_s: float = 2.0,
    memory_mb: int = 512,
    allow_unsafe_code_execution: bool = False,
    max_parallel: int = 2,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 iff the completion's program passes every test case, else 0.0."""
    limits = _limits(wall_s, memory_mb)
    log = kwargs.get("log_metric")
    return _scores(completions, test_cases, True, limits, allow_unsafe_code_execution, max_parallel, log)
