"""Tools and environments for multi-turn episodes (stage 2; the loop is rollout/episodes.py).

Beside ``rewards/`` and sharing its sandbox: ``tools.py`` describes and calls tools, ``parse.py``
reads tool calls from the model's text and renders results, ``builtin.py`` holds the built-in tools.
``resolve_tools`` / ``resolve_environment`` turn the ``env`` config section into callables, and
``environment_reward`` makes an environment's ``get_reward()`` a reward function (TRL's convention).
"""

from __future__ import annotations

from typing import Any, Callable

from grpokit.config.sections import ConfigError

from .builtin import BUILTIN_TOOLS, calculator, make_python_tool, sandbox_wall_s
from .parse import ToolCall, parse_tool_calls
from .tools import TerminalToolError, ToolResult, call_tool, check_environment, environment_tools, tool_schema


def _import(path: str, field: str) -> Any:
    from grpokit.rewards.spec import RewardError, _import_path

    try:
        return _import_path(path)
    except RewardError as e:
        raise ConfigError(f"{field}: {e}") from None


def resolve_tools(
    names: list[str], *, tool_timeout_s: float = 10.0, allow_unsafe_code_execution: bool = False
) -> list[Callable]:
    """``env.tools`` entries as callables: built-in names or "module:function" import paths. ``tool_timeout_s``
    is a call's deadline (env.tool_timeout_s): the python tool's sandbox stops a program before it
    (``sandbox_wall_s``)."""
    out = []
    for name in names:
        if name == "calculator":
            out.append(calculator)
        elif name == "python":
            wall_s = sandbox_wall_s(tool_timeout_s)
            out.append(make_python_tool(wall_s=wall_s, allow_unsafe_code_execution=allow_unsafe_code_execution))
        elif ":" in name:
            out.append(_import(name, "env.tools"))
        else:
            raise ConfigError(
                f"env.tools: {name!r} is not a built-in tool ({', '.join(BUILTIN_TOOLS)}) "
                "nor an import path module:function"
            )
    return out


def resolve_environment(path: str) -> Callable[[], Any] | None:
    """``env.environment`` ("module:Class" or "module:factory") as a factory, or None when empty."""
    if not path:
        return None
    if ":" not in path:
        raise ConfigError(f"env.environment={path!r} must be an import path module:Class (or module:factory)")
    factory = _import(path, "env.environment")
    check_environment(factory)
    return factory


def environment_reward(factory: Callable[[], Any]) -> Callable | None:
    """A reward function reading ``get_reward()`` of each episode's environment (None when the
    environment has no ``get_reward``); named after the environment's class, as in TRL."""
    return _class_reward(type(factory()))


def environment_rewards(factory: Callable[[], Any] | dict[str, Callable[[], Any]] | None) -> list[Callable]:
    """The reward functions of one factory or of named ones (a dict): one per environment class with
    ``get_reward``, once per class even under two names (as TRL); each scores only the episodes whose
    environment is exactly its class and gives None (no score) to the others."""
    factories = list(factory.values()) if isinstance(factory, dict) else [factory] if factory else []
    classes = []
    for f in factories:
        cls = type(f())
        if cls not in classes:
            classes.append(cls)
    return [r for r in map(_class_reward, classes) if r is not None]


def _class_reward(cls: type) -> Callable | None:
    if not callable(getattr(cls, "get_reward", None)):
        return None

    def reward(completions, environments=None, **kwargs):
        envs = environments or [None] * len(completions)
        return [e.get_reward() if type(e) is cls else None for e in envs]

    reward.__name__ = cls.__name__
    return reward


__all__ = [
    "ToolCall",
    "ToolResult",
    "TerminalToolError",
    "call_tool",
    "calculator",
    "environment_reward",
    "environment_rewards",
    "environment_tools",
    "make_python_tool",
    "parse_tool_calls",
    "resolve_environment",
    "resolve_tools",
    "tool_schema",
]
