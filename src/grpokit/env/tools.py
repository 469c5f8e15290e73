"""Tools: plain Python functions (TRL's ``tools=``) and environment methods, described by JSON
schemas and called with containment.

A tool is a function with type hints and a Google-style docstring; its name, hints and docstring
become the JSON schema a chat template shows the model (``transformers.utils.get_json_schema``, the
function TRL relies on too). An environment (TRL's ``environment_factory=``) is an object with
``reset(**row)``; its public methods are its tools, and ``get_reward()``, when defined, is a reward
source. One environment instance per episode.

Calls never crash a run. A tool that raises becomes the tool message ``{'error': '...'}`` (TRL's
convention) and is counted as a tool error; a tool that runs past its time limit becomes an error
message too. Tools run in a daemon thread of the trainer, one of the tool's reused workers
(env/workers.py). At the time limit the episode moves on and the thread is asked to stop (an
exception raised in it at its next Python instruction: a loop stops, a ``time.sleep`` or a blocking
read only when it returns) and is never handed another call; at most ``MAX_ABANDONED`` timed-out
calls of one tool may still be running, and further calls of that tool fail at once instead of starting
more threads, so a hanging tool cannot leak threads. A tool that must be cut off hard (untrusted
code) belongs in the sandbox: the built-in ``python`` tool (env/builtin.py) runs code there, like code
rewards. A tool that raises ``TerminalToolError`` ends its episode (finish reason "tool_error").

Results are untrusted too: one whose ``str()`` raises, or that nests deeper than ``max_depth``
(``env.max_tool_nesting``), becomes an error message; every text is cut at ``max_chars`` and marked, and
the result says so (``ToolResult.truncated``: counted in ``tools/truncated_frequency``, warned about once).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable

from grpokit.config.sections import ConfigError
from grpokit.rewards.process_tree import watching

from . import workers

MAX_ABANDONED = 4  # timed-out calls of one tool that may still run in the background


class ToolTimedOut(BaseException):
    """Raised inside a tool's thread when its time limit has passed (see the module docstring)."""


class TerminalToolError(Exception):
    """Raise from a tool when the failure ends the episode (the environment cannot go on)."""


@dataclass(frozen=True)
class ToolResult:
    """What one call produced: the text the episode shows the model, and how it went."""

    name: str
    content: str
    error: bool = False
    terminal: bool = False
    seconds: float = 0.0
    timed_out: bool = False  # ran past its deadline, or not run while earlier timed-out calls still run
    truncated: bool = False  # its text was cut at max_chars


def tool_name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def tool_schema(fn: Callable) -> dict[str, Any]:
    """The JSON schema of a tool (type hints + Google-style docstring), as chat templates expect."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers raises its own error types for missing hints / docstrings
        raise ConfigError(
            f"tool {tool_name(fn)!r} cannot be described to the model ({e}); give it type hints "
            "and a Google-style docstring with an Args: section"
        ) from None


def environment_tools(env: Any, tools: list[Callable] = ()) -> list[Callable]:
    """The public methods of an environment instance (its tools), as TRL exposes them: every
    function of its class whose name does not start with "_", except ``reset`` and ``get_reward``.

    Refused in one sentence (ConfigError): a ``done`` method (grpokit reads ``done`` after each turn as a
    flag: a bound method is always true, so every episode ended after its first tool call, and ``done`` was
    offered as a tool), and a method named as one of the standalone ``tools`` (which one a call ran was
    decided silently by the order of a dict)."""
    cls = type(env)
    if callable(getattr(cls, "done", None)):
        raise ConfigError(
            f"the environment {cls.__name__} defines done as a method; done must be an attribute or property, "
            "not a method (set self.done = True when the episode is over, or decorate it with @property)"
        )
    names = [
        n
        for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not n.startswith("_") and n not in ("reset", "get_reward")
    ]
    taken = {tool_name(t) for t in tools}
    for n in names:
        if n in taken:
            raise ConfigError(
                f"the environment {cls.__name__}'s method {n!r} has the same name as a tool passed in tools; "
                "tool names must be unique, so rename one of them"
            )
    return [getattr(env, n) for n in names]


def check_tool_names(tools: list[Callable]) -> None:
    """Refuse two tools with the same name in one sentence: the model calls a tool by name, so one of
    them could never be called (before: the second made every call of that name unreadable)."""
    seen: set[str] = set()
    for t in tools:
        name = tool_name(t)
        if name in seen:
            raise ConfigError(
                f"two tools are named {name!r}; tool names must be unique (a tool's name is its __name__), "
                "so rename one of them"
            )
        seen.add(name)


def check_environment(factory: Callable) -> None:
    """Build one instance and check it has ``reset`` (one sentence otherwise)."""
    env = factory()
    if not callable(getattr(env, "reset", None)):
        raise ConfigError(
            f"the environment {type(env).__name__} has no reset method; an environment needs "
            "reset(**row) (returning None or an observation string) and public methods as tools"
        )


def call_tool(
    tools: dict[str, Callable],
    name: str,
    arguments: dict[str, Any] | str,
    *,
    timeout_s: float,
    max_chars: int,
    max_depth: int = 20,
) -> ToolResult:
    """Call ``tools[name]`` with ``arguments`` (a dict of keywords, or one string for the tool's
    first parameter) in a daemon thread; never raises. ``max_chars`` caps the returned text."""
    start = time.perf_counter()
    fn = tools.get(name)
    if fn is None:
        valid = ", ".join(sorted(tools)) or "none"
        return _error(name, f"Tool {name} not found (tools: {valid})", max_chars)
    busy = _still_running(name)
    if busy >= MAX_ABANDONED:
        return _error(
            name,
            f"Tool {name} not run: {busy} earlier calls that timed out are still running",
            max_chars,
            timed_out=True,
        )

    def run() -> tuple[str, Any]:
        try:
            value = fn(**arguments) if isinstance(arguments, dict) else fn(arguments)
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
            return "text", _result_text(value, max_depth)
        except BaseException as e:  # contained: reported as the tool's message
            return "error", e

    with watching():  # what the tool starts is noted, to end with the run (rewards/process_tree.py)
        task = workers.submit(f"tool-{name}", run)
        if not task.wait(max(0.0, timeout_s)) and task.starved() and task.abandon(ToolTimedOut):
            if workers.retry_fits(f"tool-{name}", MAX_ABANDONED):  # the abandoned call counts: within the bound
                task = workers.submit(f"tool-{name}", run)  # cut by the machine's slowness, not its own: once more
                task.wait(max(0.0, timeout_s))  # each from when the call began (env/workers.py)
    seconds = time.perf_counter() - start
    if not task.done.is_set() and task.abandon(ToolTimedOut):  # asked to stop, and counted until it does
        return _error(name, f"Tool {name} timed out after {timeout_s:g} s", max_chars, seconds=seconds, timed_out=True)
    kind, value = task.value
    if kind == "error":
        return _error(name, _describe(value), max_chars, terminal=isinstance(value, TerminalToolError), seconds=seconds)
    return ToolResult(name, cap_text(value, max_chars), seconds=seconds, truncated=is_cut(value, max_chars))


def _describe(e: BaseException) -> str:
    try:
        return str(e) or type(e).__name__
    except Exception:  # an exception whose own __str__ raises
        return type(e).__name__


def _result_text(value: Any, max_depth: int) -> str:
    """The tool message for a returned value; raises ValueError for one too deep or unprintable."""
    if max_depth and _depth(value, max_depth + 1) > max_depth:
        raise ValueError(f"the tool's result nests deeper than env.max_tool_nesting={max_depth}")
    try:
        return str(value)
    except Exception as e:
        raise ValueError(f"the tool's result could not be turned into text ({type(e).__name__})") from None


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of lists / tuples / dicts / sets in ``value``, counted up to ``limit`` (no recursion)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, tuple, dict, set, frozenset)):
            if d + 1 >= limit:
                return limit
            deepest = max(deepest, d + 1)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _error(name: str, message: str, max_chars: int, **kw: Any) -> ToolResult:
    text = str({"error": message})
    return ToolResult(name, cap_text(text, max_chars), error=True, truncated=is_cut(text, max_chars), **kw)


def _still_running(name: str) -> int:
    return workers.running_abandoned(f"tool-{name}")


async def _await(value):
    return await value


def is_cut(text: str, max_chars: int) -> bool:
    """Whether ``cap_text`` cuts ``text`` at ``max_chars`` (0 = no cap)."""
    return bool(max_chars) and len(text) > max_chars


CUT_MARK = "...[truncated]"
"""What follows a text ``cap_text`` cut."""


def cap_text(text: str, max_chars: int) -> str:
    """``text`` cut at ``max_chars`` characters (0 = no cap), marked when cut."""
    if is_cut(text, max_chars):
        return text[:max_chars] + CUT_MARK
    return text
