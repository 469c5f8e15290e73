"""data.system_prompt: the system message a run adds to every prompt that goes through the chat template.

A conversation has one system message. A row that carries its own beside data.system_prompt would keep only
one of the two, and either choice drops a text the user wrote without a word (before: the row's own was kept
and the setting dropped for that row alone), so the pair is refused when the rows load, naming the rows. Text
rows (data/prompts.py) and image rows (data/vision.py) follow this one rule, in training and in
``grpokit eval`` alike.
"""

from __future__ import annotations

from typing import Any, Callable

from grpokit.config.sections import ConfigError


def has_system_message(prompt: Any) -> bool:
    """Whether a prompt given as chat messages holds a system message."""
    return isinstance(prompt, list) and any(isinstance(m, dict) and m.get("role") == "system" for m in prompt)


def check_system_prompt(prompts: list, system_prompt: str, source: str = "the data") -> None:
    """Refuse ``system_prompt`` (data.system_prompt) when any of ``prompts`` carries its own system message,
    naming the first rows (1-based) of ``source`` that do."""
    if not system_prompt:
        return
    own = [n for n, p in enumerate(prompts, 1) if has_system_message(p)]
    if own:
        shown = ", ".join(str(n) for n in own[:5]) + (f" ... ({len(own)} of {len(prompts)})" if len(own) > 5 else "")
        rows = f"row {shown} of {source} carries" if len(own) == 1 else f"rows {shown} of {source} carry"
        raise _clash(rows)


def with_system_prompt(messages: list, system_prompt: str, content: Callable[[str], Any] = str) -> list:
    """``messages`` with ``system_prompt`` as a first system message (``content`` shapes its content: image
    prompts' are text parts); unchanged when it is empty; refused when they hold a system message already."""
    if not system_prompt:
        return messages
    if has_system_message(messages):
        raise _clash("the prompt carries")
    return [{"role": "system", "content": content(system_prompt)}, *messages]


def _clash(who: str) -> ConfigError:
    return ConfigError(
        f"data.system_prompt is set but {who} a system message already, and a conversation has only one, so one "
        "of the two texts would be dropped; leave data.system_prompt empty, or remove the system messages from "
        "the rows (writing data.system_prompt's text into them where both are wanted)"
    )
