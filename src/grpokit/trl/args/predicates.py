"""The pieces the groups' single-value checks are written with (checks.py runs them): value predicates and
``Gate``, the arguments that make TRL read a field."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def at_least(lo: float, integer: bool = False, none: bool = False) -> Callable[[Any], bool]:
    return lambda x: (none and x is None) or ((is_int(x) if integer else is_number(x)) and x >= lo)


def above(lo: float, none: bool = False) -> Callable[[Any], bool]:
    return lambda x: (none and x is None) or (is_number(x) and x > lo)


def within(lo: float, hi: float, none: bool = False) -> Callable[[Any], bool]:
    return lambda x: (none and x is None) or (is_number(x) and lo <= x <= hi)


@dataclass(frozen=True)
class Gate:
    """The arguments that make TRL read a gated field: ``on(args)`` is True when it reads it."""

    args: tuple[str, ...]
    on: Callable[[Any], bool]
    off: dict[str, Any] | None = None  # an any-of gate: each argument's off value (the words name those not off)

    def words(self, a: Any) -> str:
        names = [n for n in self.args if self.off is None or getattr(a, n) != self.off[n]]
        return " and ".join(f"{n}={getattr(a, n)!r}" for n in names)
