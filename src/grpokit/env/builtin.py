"""Built-in tools, named in ``env.tools``: ``calculator`` and ``python``.

``calculator`` evaluates arithmetic by walking the expression's syntax tree (numbers, + - * / // %
**, parentheses; no names, no calls), with bounded exponents and operand sizes, so no input can run
code or take long. ``python`` runs a program in the same sandbox as the code rewards
(rewards/sandbox/: no network, a private filesystem, CPU/memory/process limits, a wall-clock kill
of the whole process tree) and returns what it printed; on a host where the sandbox does not
isolate it refuses, unless ``env.allow_unsafe_code_execution`` is set.

The python tool's failures are the model's program's, and the model reads them as an ordinary tool error:
a program that raises shows the last lines of its traceback (``MAX_ERROR_LINES``), one that runs past its
wall clock says so. That wall clock is ``sandbox_wall_s(env.tool_timeout_s)``, below the tool call's
deadline, so the sandbox stops the model's own endless loop or fork bomb and the call ends as an error
message; before, the two were equal, the deadline fired first and the model's loop was counted as a
hung tool, stopping the run with the advice to fix the tool. Output past ``max_output_bytes`` is cut and
marked.
"""

from __future__ import annotations

import ast
import json
import math
import operator
from typing import Callable

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
MAX_DIGITS = 60  # operands and results beyond this many digits are refused (no multi-second big-int math)
SANDBOX_SHARE = 0.75  # the python tool's wall clock as a share of the tool call's deadline
MAX_ERROR_LINES = 8  # last lines of a failed program's stderr (its traceback) shown to the model
STDERR_TAIL_BYTES = 2048  # how much of the end of its stderr the sandbox reports


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(12+3)*45".
    """
    tree = ast.parse(expression.strip(), mode="eval")
    value = _eval(tree.body)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(value)


def _eval(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval(node.operand)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(b) > 64 or abs(a) > 10**6):
            raise ValueError("exponent or base too large")
        out = _OPS[type(node.op)](a, b)
        if isinstance(out, int) and abs(out) >= 10**MAX_DIGITS or isinstance(out, float) and not math.isfinite(out):
            raise ValueError("result too large")
        return out
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def sandbox_wall_s(tool_timeout_s: float) -> float:
    """The python tool's wall clock for a tool call's deadline ``tool_timeout_s``: three quarters of it
    (10 s -> 7.5 s), leaving the rest for ending its process tree (the sandbox's start-up is start-up,
    outside the deadline: rewards/sandbox/isolation.py), so a program that runs on is stopped by the
    sandbox, an error the model reads, before the deadline counts the call as a hung tool."""
    return SANDBOX_SHARE * tool_timeout_s


def program_failure(rec: dict, stdout: str) -> str:
    """The message a failed program's record becomes: its exit status, what it printed, and the last
    ``MAX_ERROR_LINES`` lines of its stderr (the traceback's end)."""
    code = rec.get("returncode")
    text = "the program failed" + (f" (exit status {code})" if isinstance(code, int) else "")
    lines = str(rec.get("stderr", "")).rstrip().splitlines()[-MAX_ERROR_LINES:]
    if stdout:
        text += f"; it printed: {stdout.rstrip()}"
    if lines:
        text += "; its error output ended with:\n" + "\n".join(lines)
    return text


def shown_stdout(rec: dict, max_output_bytes: int) -> str:
    """What a program printed, marked when the sandbox kept only the first ``max_output_bytes`` bytes."""
    out, total = str(rec.get("stdout", "")), rec.get("stdout_bytes")
    if isinstance(total, int) and total > max_output_bytes:
        out += f"...[output cut: the first {max_output_bytes} of {total} bytes shown]"
    return out


def make_python_tool(
    wall_s: float = 5.0, memory_mb: int = 512, allow_unsafe_code_execution: bool = False, max_output_bytes: int = 4096
) -> Callable[[str], str]:
    """The ``python`` tool with these limits: runs ``code`` in the sandbox, returns its stdout (cut and marked
    past ``max_output_bytes``). Keep ``wall_s`` below the tool call's deadline (``sandbox_wall_s``), so that a
    program running past it is the model's error, not a hung tool."""
    from grpokit.rewards.calls import startup
    from grpokit.rewards.code import HARNESS, require_isolation
    from grpokit.rewards.sandbox.isolation import Limits, run_sandboxed

    limits = Limits(
        wall_s=wall_s,
        cpu_s=max(1, math.ceil(wall_s)),
        memory_bytes=memory_mb * 2**20,
        max_output_bytes=max_output_bytes,
    )

    def python(code: str) -> str:
        """Run a Python program in a sandbox (no network, no files of the host) and return what it printed.

        Args:
            code: the program; use print() to show results.
        """
        with startup():  # the host's isolation probe (once per process): start-up, not the call's deadline
            isolated = require_isolation(allow_unsafe_code_execution, limits)  # this tool's own budget
        job = {
            "mode": "stdio",
            "inputs": [""],
            "case_timeout_s": wall_s,
            "max_output_bytes": max_output_bytes,
            "stderr_bytes": STDERR_TAIL_BYTES,
        }
        files = {"solution.py": code, "job.json": json.dumps(job), "harness.py": HARNESS}
        res = run_sandboxed(
            files, ["{python}", "-I", "-S", "{job}/harness.py", "{job}", "{scratch}"], limits, isolated=isolated
        )
        rec = res.records[0] if res.records else {"status": "timeout" if res.timed_out else "error"}
        if rec.get("status") == "timeout" or res.timed_out:  # the program's own doing: an error it reads
            raise TimeoutError(f"the program ran past its {wall_s:g} s limit and was killed")
        out = shown_stdout(rec, max_output_bytes)
        if rec.get("status") != "ok":
            raise RuntimeError(program_failure(rec, out))
        return out

    return python


BUILTIN_TOOLS = ("calculator", "python")
