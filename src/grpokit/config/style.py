"""Which of the two config files ``grpokit train --config`` reads: grpokit's sections or TRL's flat names.

A grpokit config is a mapping of sections (``model: {...}``, ``train: {...}``); a TRL config is the flat
argument names of TRL's ``trl grpo`` (``model_name_or_path``, ``learning_rate`` ...). Two names belong to
both: ``env`` (grpokit's environment section; in a TRL file, the variables TRL's parser exports) and
``optim`` (grpokit's optimizer section; TRL's optimizer name, a string). So the style is decided by the
keys only one style has: grpokit's sections other than ``env`` (``optim`` only as a mapping) on one
side, TRL's argument names that are no section on the other. A file with both is refused, naming each.
One decision for the CLI (which must tell a grpokit file apart without importing the TRL layer: its
imports take seconds) and for the TRL layer's reader.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Literal

from .base import ConfigError

SHARED: dict[str, Callable[[Any], bool]] = {
    "env": lambda value: True,  # a mapping in either style: TRL's whenever the file has TRL's names
    "optim": lambda value: not isinstance(value, dict),  # TRL's optimizer name; grpokit's section is a mapping
}
"""The top-level names both styles use (see the module docstring), each with whether a value has TRL's shape."""


def config_style(data: Any, trl_names: Callable[[], Collection[str]], source: str) -> Literal["grpokit", "trl"]:
    """``"trl"`` when ``data`` has TRL argument names that are no grpokit section and no grpokit-only section,
    else ``"grpokit"`` (grpokit's reader then refuses what it cannot read: not a mapping, an unknown section).
    ``trl_names()`` (TRL's argument names) is called only when ``data`` has keys that are no section.
    A mapping with keys of both styles is refused in one sentence naming them; ``source`` names the file."""
    if not isinstance(data, dict):
        return "grpokit"
    from .io import _sections

    sections = set(_sections())
    ours = [k for k, v in data.items() if k in sections and not (k in SHARED and SHARED[k](v))]
    others = [k for k in data if k not in sections]
    names = set(trl_names()) if others else set()
    theirs = [k for k in others if k in names]
    if theirs and ours:
        raise ConfigError(
            f"{source} mixes grpokit's sections ({', '.join(map(str, ours))}) with TRL's flat argument names "
            f"({', '.join(map(str, theirs))}); write it in one style: grpokit's sections (model: {{name: ...}}, "
            "train: {steps: ...}) or only TRL's names (model_name_or_path: ..., max_steps: ...)"
        )
    return "trl" if theirs else "grpokit"
