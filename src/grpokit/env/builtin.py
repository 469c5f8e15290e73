"""Built-in tools, named in ``env.tools``: ``calculator`` and ``python``.

``calculator`` evaluates arithmetic by walking the expression's syntax tree (numbers, + - * / // %
**, parentheses; no names, no calls), with bounded exponents and operand sizes, so no input can run
code or take long. ``python`` runs a program in the same sandbox as the code rewards
(rewards/sandbox/: no network, a private filesystem, CPU/memory/process limits, a wall-clock kill
of the whole process tree) and returns what it printed; on a host where the sandbox does not
isolate it refuses, unless ``env.allow_unsafe_code_execution`` is set.
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


def make_python_tool(
    wall_s: float = 5.0, memory_mb: int = 512, allow_unsafe_code_execution: bool = False, max_output_bytes: int = 4096
) -> Callable[[str], str]:
    """The ``python`` tool with these limits: runs ``code`` in the sandbox, returns its stdout."""
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
        job = {"mode": "stdio", "inputs": [""], "case_timeout_s": wall_s, "max_output_bytes": max_output_bytes}
        files = {"solution.py": code, "job.json": json.dumps(job), "harness.py": HARNESS}
        res = run_sandboxed(
            files, ["{python}", "-I", "-S", "{job}/harness.py", "{job}", "{scratch}"], limits, isolated=isolated
        )
        rec = res.records[0] if res.records else {"status": "timeout" if res.timed_out else "error"}
        if rec.get("status") == "timeout" or res.timed_out:
            raise TimeoutError(f"the program ran past {wall_s:g} s and was killed")
        if rec.get("status") != "ok":
            out = rec.get("stdout", "")
            raise RuntimeError("the program failed" + (f"; it printed: {out}" if out else ""))
        return rec.get("stdout", "")

    return python


BUILTIN_TOOLS = ("calculator", "python")
