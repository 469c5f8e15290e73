"""Environments from shared libraries, each through one small adapter file (docs/AGENTS.md).

grpokit's environment interface is TRL's ``environment_factory`` class: one instance per episode,
``reset(**row)`` returning the first observation (joined to the prompt), public methods as the
tools the model calls (a call is the episode's step, its return value the next observation, shown
as a tool turn), ``done`` read after each step, and ``get_reward()`` the episode's reward. An
adapter turns a library's own protocol into such a class:

    openenv_env.py     an OpenEnv server (reset / step over its websocket client)
    textarena_env.py   a TextArena game (reset / step of the game engine, its own reward)
    verifiers_env.py   a verifiers taskset (prompts), its task's @reward functions (one reward
                       component each) and its @tool toolsets (the episode's tools)

The next library is one more file here: build the class, and say in one sentence what is missing
when the library is not installed (``require``). The libraries are optional dependencies:
``pip install 'grpokit[openenv]'`` (or ``[verifiers]``, ``[textarena]``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from grpokit.config.base import ConfigError

EXTRAS = {"openenv": "openenv", "verifiers": "verifiers", "textarena": "textarena"}


def require(module: str, extra: str) -> ModuleType:
    """Import a library an adapter needs, or say in one sentence how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(
            f"this environment needs the {extra} library ({e.name or module} is not installed); "
            f"install it with: pip install 'grpokit[{extra}]'"
        ) from None


__all__ = ["EXTRAS", "require"]
