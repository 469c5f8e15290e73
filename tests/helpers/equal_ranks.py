"""A stand-in for rank 0 of two ranks that hold the same numbers (tests of what the update sums across ranks)."""

from __future__ import annotations


class TwoEqualRanks:
    """Rank 0 of two whose other rank holds the same numbers: every sum doubles; each all-reduce is counted
    (``calls``: how many floats each carried)."""

    active = True

    def __init__(self):
        self.calls: list[int] = []

    def sum_floats(self, values):
        self.calls.append(len(values))
        return [2.0 * v for v in values]

    def sync_grads(self, params):
        pass
