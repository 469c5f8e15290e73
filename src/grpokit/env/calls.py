"""Calling many untrusted functions at once, each with its own deadline, and never waiting past it.

Environment ``reset()`` calls of a batch (one per episode) go through ``call_many``. A Python thread
cannot be killed, and the trainer's main thread can only interrupt Python code (SIGALRM, as
rewards/inproc.py does), not a call stuck in C or one that swallows the exception; run one after
another, a batch of hung resets cost ``reset_timeout_s`` per episode (a 2-step run with a reset that
sleeps forever sat 10 minutes in silence). So:

- each call runs in a daemon thread (it never blocks the process's exit), at most ``threads`` at
  once, and each has its own deadline of ``timeout_s`` from its start (when its thread began it,
  start-up it marks left out: ``Task.left``): a batch of hung calls costs
  one deadline, not one per episode. The threads are a key's reused workers (env/workers.py): a
  thread start per call cost more than the calls themselves on a loaded machine;
- at its deadline a call is abandoned: it becomes a timed-out ``Outcome``, and its thread is asked
  to stop (an exception raised at its next Python instruction: a loop stops, a sleep when it returns)
  and is never handed another call;
- a key's running calls and abandoned ones still running are at most ``MAX_ABANDONED`` threads
  together, a call retried because the machine starved it included: a new call waits for a live one
  to end, and when all of them are abandoned ones, further calls fail at once as timeouts instead of
  starting threads, so a function that hangs on every call cannot pile threads up, step after step.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from grpokit.rewards.errors import RewardError
from grpokit.rewards.pool import Outcome
from grpokit.rewards.process_tree import watching

from . import workers
from .workers import CallAbandoned

MAX_ABANDONED = 8  # abandoned calls of one key that may still be running


class EnvironmentFailure(RewardError):
    """An environment or a tool failed on more of a batch's episodes than ``env.max_failure_fraction``
    allows: the run stops with one sentence (as a reward function failing on most of a batch does)."""


def check_failures(what: str, failed: int, total: int, max_fraction: float, detail: str = "") -> None:
    """Raise EnvironmentFailure when ``failed`` of a batch's ``total`` episodes is more than ``max_fraction``."""
    if total and failed > max_fraction * total:
        raise EnvironmentFailure(
            f"{what} on {failed} of {total} episodes, more than "
            f"env.max_failure_fraction={max_fraction:g}" + (f"; {detail}" if detail else "")
        )


def still_running(key: str) -> int:
    """How many abandoned calls of ``key`` are still running."""
    return workers.running_abandoned(key)


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose own __str__ raises
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def call_many(key: str, calls: list[Callable[[], Any]], timeout_s: float, threads: int = 8) -> list[Outcome]:
    """One Outcome per call, in order; returns within about ``ceil(len(calls) / threads) * timeout_s``
    and, when every call hangs, within one ``timeout_s`` (the rest fail at once, see the docstring).
    The processes the calls start are noted, to end with the run (process_tree.watching)."""
    with watching():
        return _call_many(key, calls, timeout_s, threads)


def _call_many(key: str, calls: list[Callable[[], Any]], timeout_s: float, threads: int) -> list[Outcome]:
    outcomes: list[Outcome | None] = [None] * len(calls)
    cond = threading.Condition()
    live: dict[int, workers.Task] = {}
    retried: set[int] = set()
    queued = iter(range(len(calls)))
    nxt = next(queued, None)

    def wake() -> None:
        with cond:
            cond.notify()

    while nxt is not None or live:
        while nxt is not None and len(live) < threads:
            busy = still_running(key)
            if busy + len(live) >= MAX_ABANDONED:  # every live call may be abandoned too: the bound holds
                if live:
                    break
                outcomes[nxt] = Outcome(
                    False, error=f"not run: {busy} earlier calls that timed out are still running", timed_out=True
                )
            else:
                live[nxt] = workers.submit(key, functools.partial(_contained, calls[nxt]), wake)
            nxt = next(queued, None)
        if not live:
            continue
        with cond:
            if not any(t.done.is_set() for t in live.values()):
                cond.wait(max(0.0, min(t.left(timeout_s) for t in live.values())))
        for i, task in list(live.items()):
            if task.done.is_set():
                outcomes[i] = task.value
            elif task.left(timeout_s) > 0:
                continue
            else:
                starved = task.starved()  # read before the stop: a thread that has ended has no CPU times
                if not task.abandon(CallAbandoned):  # it finished as its deadline passed: its result stands
                    outcomes[i] = task.value
                elif starved and i not in retried and workers.retry_fits(key, MAX_ABANDONED, len(live) - 1):
                    retried.add(i)  # the machine's slowness, not the call's: once more, within the bound
                    live[i] = workers.submit(key, functools.partial(_contained, calls[i]), wake)
                    continue
                else:
                    outcomes[i] = Outcome(False, error=f"timed out after {timeout_s:g} s", timed_out=True)
            del live[i]
    return [o if o is not None else Outcome(False, error="not run") for o in outcomes]


def _contained(call: Callable[[], Any]) -> Outcome:
    """The call's Outcome; what it raises (SystemExit too) is the call's failure, never the run's."""
    try:
        return Outcome(True, call())
    except BaseException as exc:
        return Outcome(False, error=_describe(exc))
