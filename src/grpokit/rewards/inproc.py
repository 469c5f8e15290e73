"""Calling untrusted Python in the trainer's own process, with a deadline that holds.

Reward functions run in the trainer process when ``reward.num_workers`` is 0 (the default) or when a
function cannot be pickled. A thread cannot be stopped from outside in Python, so a plain
``future.result(timeout=...)`` only *abandons* a hung call: the thread keeps running, and at exit the
interpreter waits for it forever (the run "finishes" but the process never exits). Instead:

- In the main thread (the training loop's), a call runs right there under an interval timer
  (``setitimer`` + SIGALRM). When the deadline passes, the signal handler raises ``CallTimedOut``
  inside the call: loops, sleeps, socket reads and subprocess waits are all stopped. What it cannot
  stop is one long C call that never returns to the interpreter (``10**10**8``); use worker processes
  (``reward.num_workers >= 1``) for functions that may do that: there the deadline is a SIGKILL.
- Elsewhere (a function scored from a helper thread), the call runs in a *daemon* thread: the deadline
  is soft (the call is abandoned, counted as a timeout, and asked to stop: an exception is raised in
  the thread at its next Python instruction) but never blocks the process's exit, and at
  most ``MAX_ABANDONED`` abandoned calls of one function may still be running: further calls fail at
  once as timeouts instead of starting more threads (no thread leak).

Start-up inside a call (``grpokit.rewards.calls.startup``: the verifier pool spawned and warmed on
the first math reward, the sandbox probed on the first code reward) stops the deadline in both modes:
the alarm is suspended and set again with what was left, and the daemon-thread wait does not count it.

A main-thread call cut at its deadline after spending more than half of it waiting for a CPU (a
loaded machine, read from /proc) is tried once more before its time-out counts, as in a worker.

Exceptions that would end a process (``SystemExit`` from ``sys.exit(3)``, ``KeyboardInterrupt`` raised by
the function itself) are the call's failure, not the run's; a real Ctrl-C during the call still stops
the run, because the SIGINT handler installed for the call marks it as real (and hands it to the
handler it replaced, such as the training loop's graceful stop, which finishes the step first).
"""

from __future__ import annotations

import ctypes
import signal
import threading
import time
from typing import Any, Callable

from .calls import ThreadClock, deadline_clock
from .errors import RewardInfrastructureError
from .pool import START_TIMEOUT_S, Outcome
from .process_tree import watching

MAX_ABANDONED = 4  # timed-out daemon-thread calls of one function that may still be running


class CallTimedOut(BaseException):
    """Raised inside an in-process call when its deadline passes (a BaseException, so a reward's own
    ``except Exception`` cannot swallow it)."""


def _failure(exc: BaseException) -> Outcome:
    return Outcome(False, error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def _thread_times() -> tuple[float, float] | None:
    """(run, wait-for-a-CPU) seconds of the calling thread (/proc/self/task/TID/schedstat), or None."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb") as f:
            run_ns, wait_ns = f.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


def _was_starved(before: tuple[float, float] | None, elapsed: float) -> bool:
    after = _thread_times()
    return before is not None and after is not None and after[1] - before[1] >= 0.5 * elapsed


class _AlarmClock:
    """The main thread's deadline: pausing takes the interval timer down and keeps what was left of it."""

    def __init__(self) -> None:
        self.left = 0.0

    def pause(self, budgeted: bool = True) -> None:
        self.left = signal.setitimer(signal.ITIMER_REAL, 0)[0]

    def resume(self) -> None:
        if self.left > 0:
            signal.setitimer(signal.ITIMER_REAL, self.left)


def _call_in_main_thread(fn: Callable[..., Any], args: tuple, timeout_s: float) -> Outcome:
    interrupted = []

    def on_alarm(signum, frame):
        raise CallTimedOut()

    def on_sigint(signum, frame):  # a real Ctrl-C: remembered, so the run stops after the call unwinds
        interrupted.append(True)
        if callable(old_int) and old_int is not signal.default_int_handler:
            old_int(signum, frame)  # the loop's graceful stop: the call and the step finish, then a checkpoint
            return
        raise KeyboardInterrupt()

    old_alarm = signal.signal(signal.SIGALRM, on_alarm)
    old_int = signal.signal(signal.SIGINT, on_sigint)
    start = time.monotonic()
    previous = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with deadline_clock(_AlarmClock()):
            return Outcome(True, fn(*args))
    except CallTimedOut:
        return Outcome(False, error=f"timed out after {timeout_s:g} s", timed_out=True)
    except RewardInfrastructureError as exc:  # the machinery, not the completion: the caller stops
        return Outcome(False, error=str(exc), fatal=True)
    except KeyboardInterrupt as exc:
        if interrupted:
            raise
        return _failure(exc)
    except BaseException as exc:  # SystemExit included: the function's failure, not the run's
        if getattr(exc, "stops_the_run", False):  # the trainer's stop cut the step (train/stopping.py)
            raise
        return _failure(exc)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_alarm)
        signal.signal(signal.SIGINT, old_int)
        if previous[0] > 0:  # someone else's alarm (e.g. pytest-timeout): give back what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, previous[0] - (time.monotonic() - start)), previous[1])


class InProcessCaller:
    """Runs calls of untrusted functions in this process with a deadline (see the module docstring)."""

    def __init__(self) -> None:
        self._abandoned: dict[str, list[threading.Thread]] = {}

    def call(self, key: str, fn: Callable[..., Any], args: tuple, timeout_s: float) -> Outcome:
        """One Outcome for ``fn(*args)``; ``key`` names the function for the abandoned-thread limit.
        The processes the call starts are noted, to end with the run (process_tree.watching)."""
        with watching():
            return self._call(key, fn, args, timeout_s)

    def _call(self, key: str, fn: Callable[..., Any], args: tuple, timeout_s: float) -> Outcome:
        if threading.current_thread() is threading.main_thread():
            for attempt in (1, 2):
                before, start = _thread_times(), time.monotonic()
                out = _call_in_main_thread(fn, args, timeout_s)
                if not (out.timed_out and attempt == 1 and _was_starved(before, time.monotonic() - start)):
                    return out  # a time-out spent mostly waiting for a CPU is the machine's: once more
            return out
        return self._call_in_daemon_thread(key, fn, args, timeout_s)

    def _call_in_daemon_thread(self, key: str, fn: Callable[..., Any], args: tuple, timeout_s: float) -> Outcome:
        alive = [t for t in self._abandoned.get(key, []) if t.is_alive()]
        self._abandoned[key] = alive
        if len(alive) >= MAX_ABANDONED:
            return Outcome(
                False, error=f"not run: {len(alive)} earlier calls that timed out are still running", timed_out=True
            )
        box: list[Outcome] = []
        clock = ThreadClock()

        def run() -> None:
            try:
                with deadline_clock(clock):
                    box.append(Outcome(True, fn(*args)))
            except RewardInfrastructureError as exc:
                box.append(Outcome(False, error=str(exc), fatal=True))
            except BaseException as exc:  # contained: SystemExit, KeyboardInterrupt of the function
                box.append(_failure(exc))

        thread = threading.Thread(target=run, name=f"grpokit-reward-{key}", daemon=True)
        start = time.monotonic()
        thread.start()
        while thread.is_alive() and (left := clock.left(start, timeout_s, START_TIMEOUT_S)) > 0:
            thread.join(left)
        if thread.is_alive():
            alive.append(thread)
            if thread.ident is not None:  # CPython: raise CallTimedOut in it at its next instruction (stops loops)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(CallTimedOut))
            return Outcome(
                False,
                error=f"timed out after {timeout_s:g} s (soft: the call runs on in a daemon thread)",
                timed_out=True,
            )
        return box[0]
