"""Tools: plain Python functions (TRL's ``tools=``) and environment methods, described by JSON
schemas and called with containment.

A tool is a function with type hints and a Google-style docstring; its name, hints and docstring
become the JSON schema a chat template shows the model (``transformers.utils.get_json_schema``, the
function TRL relies on too). An environment (TRL's ``environment_factory=``) is an object with
``reset(**row)``; its public methods are its tools, and ``get_reward()``, when defined, is a reward
source. One environment instance per episode.

Calls never crash a run. A tool that raises becomes the tool message ``{'error': '...'}`` (TRL's
convention) and is counted as a tool error; a tool that runs past its time limit becomes an error
message too. Tools run in a daemon thread of the trainer, so a time-out is *soft* for Python tools:
the episode moves on, but Python cannot stop the thread, which keeps running in the background. A
tool that must be cut off hard (untrusted code) belongs in the sandbox: the built-in ``python`` tool
(env/builtin.py) runs code there, like code rewards. A tool that raises ``TerminalToolError`` ends
its episode (finish reason "tool_error").
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from grpokit.config.sections import ConfigError


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


def tool_name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def tool_schema(fn: Callable) -> dict[str, Any]:
    """The JSON schema of a tool (type hints + Google-style docstring), as chat templates expect."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers raises its own error types for missing hints / docstrings
        raise ConfigError(f"tool {tool_name(fn)!r} cannot be described to the model ({e}); give it type hints "
                          "and a Google-style docstring with an Args: section") from None


def environment_tools(env: Any) -> list[Callable]:
    """The public methods of an environment instance (its tools), as TRL exposes them: every
    function of its class whose name does not start with "_", except ``reset`` and ``get_reward``."""
    names = [n for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
             if not n.startswith("_") and n not in ("reset", "get_reward")]
    return [getattr(env, n) for n in names]


def check_environment(factory: Callable) -> None:
    """Build one instance and check it has ``reset`` (one sentence otherwise)."""
    env = factory()
    if not callable(getattr(env, "reset", None)):
        raise ConfigError(f"the environment {type(env).__name__} has no reset method; an environment needs "
                          "reset(**row) (returning None or an observation string) and public methods as tools")


def call_tool(tools: dict[str, Callable], name: str, arguments: dict[str, Any] | str, *, timeout_s: float,
              max_chars: int) -> ToolResult:
    """Call ``tools[name]`` with ``arguments`` (a dict of keywords, or one string for the tool's
    first parameter) in a daemon thread; never raises. ``max_chars`` caps the returned text."""
    start = time.perf_counter()
    fn = tools.get(name)
    if fn is None:
        valid = ", ".join(sorted(tools)) or "none"
        return ToolResult(name, str({"error": f"Tool {name} not found (tools: {valid})"}), error=True)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            value = fn(**arguments) if isinstance(arguments, dict) else fn(arguments)
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
            box["value"] = value
        except BaseException as e:  # contained: reported as the tool's message
            box["error"] = e

    thread = threading.Thread(target=run, name=f"grpokit-tool-{name}", daemon=True)
    thread.start()
    thread.join(timeout=max(0.0, timeout_s))
    seconds = time.perf_counter() - start
    if thread.is_alive():  # soft time-out: the thread is abandoned (see the module docstring)
        return ToolResult(name, str({"error": f"Tool {name} timed out after {timeout_s:g} s"}), error=True, seconds=seconds)
    if "error" in box:
        e = box["error"]
        return ToolResult(name, _cap(str({"error": str(e) or type(e).__name__}), max_chars), error=True,
                          terminal=isinstance(e, TerminalToolError), seconds=seconds)
    return ToolResult(name, _cap(str(box.get("value")), max_chars), seconds=seconds)


async def _await(value):
    return await value


def _cap(text: str, max_chars: int) -> str:
    if max_chars and len(text) > max_chars:
        return text[:max_chars] + "...[truncated]"
    return text
