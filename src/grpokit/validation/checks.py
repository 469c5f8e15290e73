"""The ways a check fails: one sentence, raised as ``ConfigError``."""

from __future__ import annotations

from typing import Any

from grpokit.config.sections import ConfigError


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def one_of(name: str, value: Any, valid: tuple[str, ...] | list[str]) -> None:
    check(value in valid, f"{name}={value!r} is not valid; choose one of: {', '.join(valid)}")


def unread(section: str, values: Any, defaults: Any, names, why: str, fix: str) -> None:
    """Each of ``names`` changed on ``values`` from its value on ``defaults`` is refused, not ignored: nothing reads
    it ``why`` ("with rollout.backend=hf", "unless algo.entropy_adaptive=true"); ``fix`` says what would."""
    for name in names:
        value, was = getattr(values, name), getattr(defaults, name)
        check(value == was, f"{section}.{name}={value!r} has no effect {why}; {fix}, or leave it {was!r}")
