"""What one reward call tells its caller besides its values: start-up time, and what its completions did.

Two side channels, both bound to the thread that runs the call (a worker process's main thread, the
trainer's main thread, or a daemon thread), so a function keeps TRL's contract (a list of floats or
None) and still tells the runner more:

- **Start-up is not the call's work.** ``startup()`` marks a stretch of a call as start-up (a verifier
  pool being spawned and warmed, the sandbox's host probe, a sandbox's launcher and bwrap starting):
  the call's deadline stops while it runs. Start-up has its own budget (``pool.START_TIMEOUT_S``,
  120 s), enforced by whoever runs the call.
  ``timed_elsewhere()`` marks a wait on work that holds deadlines of its own (the math verifier's
  budget per answer, a sandboxed program's ``wall_s``): the call's deadline stops too, without a
  budget, so answers or programs that each spend their own budget cannot together run the calling
  reward out of time and fail its honest answers with them.
  Outside a deadline-bound call both do nothing.
- **What a completion caused is counted by kind and scored 0.** ``report_fault(i, kind, reason)``
  says that completion ``i`` of the call was scored 0 for something it did itself (its verification
  ran out of budget, its program tampered with the sandbox's result channel, it crashed the verifier,
  it went past a size limit), or that it could not be scored because the machine failed
  (``machine``: the function then returns None for it). ``call_reward`` gathers these into
  ``LoggedValues.faults``; the runner counts them (``rewards/<name>/<kind>``). A direct caller (TRL)
  sees only the floats: the function returns 0.0 for the completion's faults, so stalling a checker
  or tampering with the harness earns what a wrong answer earns, never an exclusion from the group.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator, Protocol

# What a completion itself can cause; each scores 0 and is counted under its name.
COMPLETION_KINDS = ("timeouts", "tampering", "crashes", "limits")
MACHINE = "machine"  # the machine failed (no score: None), after one retry on a ready worker

_local = threading.local()


class Clock(Protocol):
    """A call's deadline clock: ``pause`` stops it (start-up begins), ``resume`` starts it again."""

    def pause(self, budgeted: bool = True) -> None: ...

    def resume(self) -> None: ...


class ThreadClock:
    """The deadline of a call waited on from another thread: time spent paused is left out (``left``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.paused_at: float | None = None
        self.paused_s = 0.0
        self.budgeted = True

    def pause(self, budgeted: bool = True) -> None:
        with self.lock:
            self.paused_at, self.budgeted = time.monotonic(), budgeted

    def resume(self) -> None:
        with self.lock:
            if self.paused_at is not None:
                self.paused_s += time.monotonic() - self.paused_at
                self.paused_at = None

    def left(self, start: float, timeout_s: float, startup_budget_s: float) -> float:
        """Seconds left of a deadline of ``timeout_s`` from ``start`` (<= 0: passed); while paused, of
        the start-up budget (at most 1 s at a time, so the waiter looks again)."""
        now = time.monotonic()
        with self.lock:
            if self.paused_at is not None:
                return min(1.0, self.paused_at + startup_budget_s - now) if self.budgeted else 1.0
            return start + self.paused_s + timeout_s - now


@contextlib.contextmanager
def deadline_clock(clock: Clock | None) -> Iterator[None]:
    """Bind the deadline clock of the call this thread is about to run."""
    previous = getattr(_local, "clock", None)
    _local.clock = clock
    try:
        yield
    finally:
        _local.clock = previous


@contextlib.contextmanager
def _paused(budgeted: bool) -> Iterator[None]:
    clock = getattr(_local, "clock", None)
    depth = getattr(_local, "pause_depth", 0)
    _local.pause_depth = depth + 1
    if clock is not None and depth == 0:  # nested pauses: the outermost one decides
        clock.pause(budgeted)
    try:
        yield
    finally:
        _local.pause_depth = depth
        if clock is not None and depth == 0:
            clock.resume()


def startup() -> contextlib.AbstractContextManager[None]:
    """Run the body as start-up: not counted against the current call's deadline, within its own budget."""
    return _paused(True)


def timed_elsewhere() -> contextlib.AbstractContextManager[None]:
    """Run the body (a wait on work with deadlines of its own) outside the current call's deadline."""
    return _paused(False)


def report_fault(index: int, kind: str, reason: str) -> None:
    """Completion ``index`` of the current reward call scored 0 for ``kind`` (or, for ``machine``, None)."""
    if kind not in COMPLETION_KINDS and kind != MACHINE:
        raise ValueError(f"fault kind must be one of {(*COMPLETION_KINDS, MACHINE)}, got {kind!r}")
    sink = getattr(_local, "faults", None)
    if sink is not None:
        sink.setdefault(int(index), (kind, str(reason)[:300]))


@contextlib.contextmanager
def collecting_faults() -> Iterator[dict[int, tuple[str, str]]]:
    """Gather ``report_fault`` calls made by this thread into the yielded dict (index -> (kind, reason))."""
    previous = getattr(_local, "faults", None)
    sink: dict[int, tuple[str, str]] = {}
    _local.faults = sink
    try:
        yield sink
    finally:
        _local.faults = previous


def describe(faults: dict[int, Any]) -> str:
    """'2 timeouts, 1 tampering' for a log line."""
    counts: dict[str, int] = {}
    for kind, _ in faults.values():
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in counts.items())
