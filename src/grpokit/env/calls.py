"""Calling many untrusted functions at once, each with its own deadline, and never waiting past it.

Environment ``reset()`` calls of a batch (one per episode) go through ``call_many``. A Python thread
cannot be killed, and the trainer's main thread can only interrupt Python code (SIGALRM, as
rewards/inproc.py does), not a call stuck in C or one that swallows the exception; run one after
another, a batch of hung resets cost ``reset_timeout_s`` per episode (a 2-step run with a reset that
sleeps forever sat 10 minutes in silence). So:

- each call runs in a daemon thread (it never blocks the process's exit), at most ``threads`` at
  once, and each has its own deadline of ``timeout_s`` from its start: a batch of hung calls costs
  one deadline, not one per episode;
- at its deadline a call is abandoned: it becomes a timed-out ``Outcome``, and its thread is asked
  to stop (an exception raised at its next Python instruction: a loop stops, a sleep when it returns);
- a key's running calls and abandoned ones still running are at most ``MAX_ABANDONED`` threads
  together: a new call waits for a live one to end, and when all of them are abandoned ones,
  further calls fail at once as timeouts instead of starting threads, so a function that hangs on
  every call cannot pile threads up, step after step.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, Callable

from grpokit.rewards.errors import RewardError
from grpokit.rewards.pool import Outcome

MAX_ABANDONED = 8  # abandoned calls of one key that may still be running
_abandoned: dict[str, list[threading.Thread]] = {}
_lock = threading.Lock()


class CallAbandoned(BaseException):
    """Raised inside an abandoned call's thread (a BaseException: ``except Exception`` cannot keep it)."""


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
    with _lock:
        alive = [t for t in _abandoned.get(key, []) if t.is_alive()]
        _abandoned[key] = alive
        return len(alive)


def _abandon(key: str, thread: threading.Thread) -> None:
    with _lock:
        _abandoned.setdefault(key, []).append(thread)
    if thread.ident is not None:  # CPython: raise CallAbandoned in it at its next Python instruction
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(CallAbandoned))


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose own __str__ raises
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def call_many(key: str, calls: list[Callable[[], Any]], timeout_s: float, threads: int = 8) -> list[Outcome]:
    """One Outcome per call, in order; returns within about ``ceil(len(calls) / threads) * timeout_s``
    and, when every call hangs, within one ``timeout_s`` (the rest fail at once, see the docstring)."""
    outcomes: list[Outcome | None] = [None] * len(calls)
    done: dict[int, Outcome] = {}
    cond = threading.Condition()
    live: dict[int, tuple[threading.Thread, float]] = {}  # call -> (thread, start)
    queued = iter(range(len(calls)))
    nxt = next(queued, None)

    def run(i: int) -> None:
        try:
            out = Outcome(True, calls[i]())
        except CallAbandoned:
            return
        except BaseException as exc:  # SystemExit too: the call's failure, never the run's
            out = Outcome(False, error=_describe(exc))
        with cond:
            done[i] = out
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
                t = threading.Thread(target=run, args=(nxt,), name=f"grpokit-{key}", daemon=True)
                live[nxt] = (t, time.monotonic())
                t.start()
            nxt = next(queued, None)
        if not live:
            continue
        with cond:
            if not any(i in done for i in live):
                cond.wait(max(0.0, min(s for _, s in live.values()) + timeout_s - time.monotonic()))
        now = time.monotonic()
        for i, (t, start) in list(live.items()):
            with cond:
                finished = done.get(i)
            if finished is not None:
                outcomes[i] = finished
                del live[i]
            elif now - start >= timeout_s:
                _abandon(key, t)
                outcomes[i] = Outcome(False, error=f"timed out after {timeout_s:g} s", timed_out=True)
                del live[i]
    return [o if o is not None else Outcome(False, error="not run") for o in outcomes]
