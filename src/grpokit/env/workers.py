"""Reused daemon worker threads for untrusted calls, one small pool per key.

env/calls.py (environment resets, ``done`` reads) and env/tools.py (tool calls) run each untrusted
call in a thread so that the trainer can stop waiting at the call's deadline. Starting a fresh thread
per call costs little alone, but a batch of 128 resets, 128 ``done`` reads and 128 tool calls a turn
is hundreds of thread starts a step, and on a loaded machine each start waits for the scheduler
(13-510 ms per 128 resets, bench/RESULTS.md, against 2.3 ms for the calls themselves). So a key's
threads are kept and handed the next call:

- a worker is a daemon thread (it never blocks the process's exit) named ``grpokit-<key>``; it runs
  one ``Task`` at a time, each in a fresh ``contextvars.Context`` (as a new thread would), and waits
  for the next; one idle for ``IDLE_S`` seconds ends, and at most ``MAX_IDLE`` wait per key;
- ``Task.abandon()`` at a call's deadline marks the worker abandoned and raises ``CallAbandoned`` in
  it (at its next Python instruction). The mark and the worker's own publication of its result take
  the same per-worker lock, so exactly one of the two happens: a task that finished is never stopped,
  and an abandoned worker never publishes, never returns to the idle list and is never handed
  another task; it ends once its call returns. The stop is sent only while the worker is still on
  that task, so it cannot land in a later call;
- a call's deadline measures the call: ``Task.left`` counts from when its worker began it (not from
  the submit, which may wait for a thread to start on a loaded machine) and leaves out start-up the
  call marks itself (``grpokit.rewards.calls.startup``), which has its own ``STARTUP_BUDGET_S``;
  one past its deadline that spent more than half of it waiting for a CPU (``Task.starved``) was cut
  by the machine's slowness, and its caller tries it once more before the time-out counts;
- ``running_abandoned(key)`` counts a key's abandoned workers still running; the callers bound it, and
  ``retry_fits`` holds a starved call's retry to the same bound;
- a forked child forgets its parent's workers (they do not exist in it) and starts its own.
"""

from __future__ import annotations

import contextvars
import ctypes
import os
import queue
import threading
import time
from typing import Any, Callable

from grpokit.rewards.calls import ThreadClock, deadline_clock

STARTUP_BUDGET_S = 120.0  # a call not begun, or in start-up, this long: its deadline has passed
IDLE_S = 60.0  # an idle worker ends after this long without work
MAX_IDLE = 16  # idle workers kept per key; one finishing while as many wait ends
_lock = threading.Lock()  # guards _idle, _abandoned and _started
_idle: dict[str, list[_Worker]] = {}
_abandoned: dict[str, list[threading.Thread]] = {}
_started: dict[str, int] = {}  # threads ever started per key (tests read it: reuse keeps it small)


class CallAbandoned(BaseException):
    """Raised inside an abandoned call's thread (a BaseException: ``except Exception`` cannot keep it)."""


class Task:
    """One call handed to a worker. ``done`` is set once its result is published; ``value`` is what
    the function returned, or ``error`` what it raised (callers pass functions that catch their own
    errors; this one is the last line)."""

    def __init__(self, fn: Callable[[], Any], notify: Callable[[], None] | None = None):
        self.fn = fn
        self.notify = notify  # called by the worker after publishing (wakes a waiting batch)
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self._worker: _Worker | None = None
        self._abandoned = False
        self.submitted = time.monotonic()
        self.started: float | None = None  # when its worker began it
        self.clock = ThreadClock()
        self.tid: int | None = None  # its worker thread's native id, and that thread's (run, wait) then
        self.times0: tuple[float, float] | None = None

    def starved(self) -> bool:
        """True when the call, still running, spent more than half its time so far waiting for a CPU:
        past its deadline, it is the machine's slowness, not the call's (its caller retries it once)."""
        if self.started is None or self.times0 is None or self.tid is None:
            return False
        now = _thread_times(self.tid)
        elapsed = time.monotonic() - self.started - self.clock.paused_s
        return now is not None and now[1] - self.times0[1] >= 0.5 * elapsed

    def left(self, timeout_s: float) -> float:
        """Seconds left of a ``timeout_s`` deadline from the call's start, start-up left out (<= 0: passed)."""
        if self.started is None:
            return min(1.0, self.submitted + STARTUP_BUDGET_S - time.monotonic())
        return self.clock.left(self.started, timeout_s, STARTUP_BUDGET_S)

    def wait(self, timeout_s: float) -> bool:
        """Wait for the result until the call's own deadline (``left``) passes; True when it is there."""
        while not self.done.is_set() and (left := self.left(timeout_s)) > 0:
            self.done.wait(left)
        return self.done.is_set()

    def abandon(self, exc: type[BaseException] = CallAbandoned) -> bool:
        """Give up on the task: True when it was still running (its worker is now abandoned and asked
        to stop), False when it had finished (its result stands). Call it at most once."""
        w = self._worker
        if w is None or self._abandoned:
            return self._abandoned
        with w.lock:
            if self.done.is_set():
                return False
            self._abandoned = w.abandoned = True
            with _lock:
                _abandoned.setdefault(w.key, []).append(w.thread)
            if w.thread.is_alive() and w.thread.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(w.thread.ident), ctypes.py_object(exc))
        return True


class _Worker:
    def __init__(self, key: str):
        self.key = key
        self.lock = threading.Lock()  # abandon() vs publishing a result: one of them wins
        self.abandoned = False
        self.inbox: queue.SimpleQueue[Task] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=f"grpokit-{key}", daemon=True)

    def _loop(self) -> None:
        try:
            while (task := self._next()) is not None:
                try:
                    task.tid = threading.get_native_id()
                    task.times0 = _thread_times(task.tid)
                    task.started = time.monotonic()
                    value, error = contextvars.Context().run(_bound, task), None
                except BaseException as e:  # the stop, or a function that does not catch its own errors
                    value, error = None, e
                with self.lock:
                    if self.abandoned:
                        return  # never publishes, never takes another task
                    task.value, task.error = value, error
                    with _lock:  # idle again before anyone sees the result: the next call can have it
                        idle = _idle.setdefault(self.key, [])
                        keep = len(idle) < MAX_IDLE
                        if keep:
                            idle.append(self)
                    task.done.set()
                if task.notify is not None:
                    task.notify()
                if not keep:
                    return
        except BaseException:  # an abandoned worker's stop landing after its call returned: it ends
            return

    def _next(self) -> Task | None:
        """The next task, or None after IDLE_S idle (unless a task was handed over meanwhile)."""
        while True:
            try:
                return self.inbox.get(timeout=IDLE_S)
            except queue.Empty:
                with _lock:
                    idle = _idle.get(self.key, [])
                    if self in idle:
                        idle.remove(self)
                        return None
                # taken off the idle list by submit(): its task is on the way


def _thread_times(tid: int) -> tuple[float, float] | None:
    """(run, wait-for-a-CPU) seconds of thread ``tid`` of this process (/proc schedstat), or None."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            run_ns, wait_ns = f.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


def _bound(task: Task) -> Any:
    with deadline_clock(task.clock):
        return task.fn()


def submit(key: str, fn: Callable[[], Any], notify: Callable[[], None] | None = None) -> Task:
    """Run ``fn`` on an idle worker of ``key`` (a new one when none is idle); returns at once."""
    task = Task(fn, notify)
    with _lock:
        idle = _idle.get(key)
        worker = idle.pop() if idle else None
        if worker is None:
            _started[key] = _started.get(key, 0) + 1
    if worker is None:
        worker = _Worker(key)
        task._worker = worker
        worker.inbox.put(task)
        worker.thread.start()
    else:
        task._worker = worker
        worker.inbox.put(task)
    return task


def running_abandoned(key: str) -> int:
    """How many abandoned workers of ``key`` are still running."""
    with _lock:
        alive = [t for t in _abandoned.get(key, []) if t.is_alive()]
        _abandoned[key] = alive
        return len(alive)


def retry_fits(key: str, bound: int, others: int = 0) -> bool:
    """The rule for trying once more a call cut because the machine starved it (``Task.starved``): only
    while ``key``'s abandoned calls still running (the cut one among them) and ``others`` calls running
    now, each of which may be abandoned too, stay under ``bound``; past it, the cut stands as a time-out."""
    return running_abandoned(key) + others < bound


def started(key: str) -> int:
    """How many threads ``key`` has started so far."""
    with _lock:
        return _started.get(key, 0)


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: it forgets their workers and starts its own."""
    global _lock
    _lock = threading.Lock()
    _idle.clear()
    _abandoned.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def run_all(key: str, fns: list[Callable[[], Any]], threads: int) -> list[Any]:
    """Each function's value, in order, at most ``threads`` running at once on ``key``'s workers.
    For trusted work whose untrusted parts hold their own deadlines (a turn's tool calls): it waits
    for all, and raises the first error one of them raised."""
    pending = iter(enumerate(fns))
    take = threading.Lock()
    out: list[Any] = [None] * len(fns)

    def drain() -> None:
        while True:
            with take:
                nxt = next(pending, None)
            if nxt is None:
                return
            out[nxt[0]] = nxt[1]()

    tasks = [submit(key, drain) for _ in range(max(1, min(threads, len(fns))))]
    for task in tasks:
        task.done.wait()
    for task in tasks:
        if task.error is not None:
            raise task.error
    return out
