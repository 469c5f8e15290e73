"""The two ways a check fails: one sentence, raised as ``ConfigError``."""

from __future__ import annotations

from typing import Any

from grpokit.config.sections import ConfigError


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def one_of(name: str, value: Any, valid: tuple[str, ...] | list[str]) -> None:
    check(value in valid, f"{name}={value!r} is not valid; choose one of: {', '.join(valid)}")
