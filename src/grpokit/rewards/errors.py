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
