"""Presets: the published hyperparameters of each recipe, as YAML files beside this module.

A preset is a partial config; it is applied on top of the defaults and below ``--config`` and
command-line overrides, so every field can still be changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..config import Config, ConfigError, from_dict

HERE = Path(__file__).parent


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def load(name: str) -> dict[str, Any]:
    path = HERE / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; valid presets: {', '.join(names())}")
    return yaml.safe_load(path.read_text()) or {}


def description(name: str) -> str:
    """The comment lines at the top of the preset file."""
    lines = (HERE / f"{name}.yaml").read_text().splitlines()
    return " ".join(l.lstrip("# ").strip() for l in lines if l.startswith("#"))


def apply(name: str, cfg: Config | None = None) -> Config:
    return from_dict(load(name), cfg)
