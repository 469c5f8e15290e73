"""Alternation, the one way bench/ measures two or more sides against each other: every round runs each
side once, and the order rotates from round to round (a, b, c; b, c, a; c, a, b ...), so the machine's
drift (other jobs, clocks, caches) and the cost of going first or last fall on every side alike."""

from __future__ import annotations

from typing import Iterator, Sequence


def turns(sides: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """``(round, side)`` in the order to run them: ``rounds`` rounds of every side, rotated each round."""
    order = list(sides)
    for r in range(rounds):
        k = r % len(order) if order else 0
        for side in order[k:] + order[:k]:
            yield r, side
