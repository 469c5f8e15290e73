"""The two kinds of reward failure, and why they are treated differently.

- A reward function failing on one completion (an exception, a timeout, a NaN) is the completion's
  problem: it is contained, counted and given `failure_value`; only when too many fail does the run stop
  (`RewardError`).
- The reward *machinery* failing (worker processes that cannot start or keep dying, a verifier that
  cannot be imported, a sandbox that no longer isolates) is nobody's completion's fault, and every score
  it would produce is made up. `RewardInfrastructureError` stops the run at once, before a step trains
  on those scores, with one sentence naming the cause and the fix. A reward function may raise it too.
"""

from __future__ import annotations


class RewardError(RuntimeError):
    """A reward function failed on more completions than the run allows, or could not be resolved."""


class RewardInfrastructureError(RewardError):
    """The reward machinery itself is broken; every score it would give is fabricated, so the run stops."""


class ItemFailure(float):
    """A reward value that says "this completion could not be scored" (a verifier's time-out or error).

    RewardRunner counts it as that completion's failure (``failures``, and ``timeouts`` when
    ``timed_out``) and gives it ``failure_value``, as if the function had raised for it alone, so a
    verifier that ran out of time never passes for a wrong answer (a silent 0.0). It is a float NaN
    for code that reads it as a number (TRL sums rewards with nansum: no score, not a zero).
    """

    def __new__(cls, reason: str, timed_out: bool = False) -> "ItemFailure":
        self = super().__new__(cls, "nan")
        self.reason, self.timed_out = reason, timed_out
        return self

    def __getnewargs__(self) -> tuple[str, bool]:  # pickles to and from worker processes
        return self.reason, self.timed_out

    def __repr__(self) -> str:
        return f"ItemFailure({self.reason!r}, timed_out={self.timed_out})"
