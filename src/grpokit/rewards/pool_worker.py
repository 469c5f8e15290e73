"""The worker process's side of `WorkerPool` (rewards/pool.py): its messages, and what it measures.

A worker speaks four kinds of message on its pipe, each a pickled tuple that starts with the request
id it belongs to:

- ``(READY, ...)`` once, after its warm-up: it can take items;
- ``(id, STARTED)`` once the item is unpickled (the reward module imported): the item's deadline
  starts here, not when it was sent, so imports and a cold start never count against it;
- ``(id, PAUSED)`` / ``(id, RESUMED)`` around start-up inside the item (``grpokit.rewards.calls.startup``:
  a verifier pool spawned and warmed, the sandbox probed): the deadline stops meanwhile, and the
  start-up budget runs; ``PAUSED_UNBUDGETED`` instead around a wait on work timed elsewhere
  (``calls.timed_elsewhere``: the verifier's own budget per answer, a sandboxed program's wall_s);
- ``(id, ok, value, error, fatal)``: the item's result.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import pickle
import signal
from multiprocessing.connection import Connection
from typing import Any, Callable

from .calls import deadline_clock
from .errors import RewardInfrastructureError
from .process_tree import become_subreaper

READY = -1  # request id of the hello a worker sends once it can take tasks
STARTED, PAUSED, PAUSED_UNBUDGETED, RESUMED = "started", "paused", "paused, timed elsewhere", "resumed"


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def sched_times(pid: int) -> tuple[float, float] | None:
    """(seconds run on a CPU, seconds spent ready to run but waiting for one) of process ``pid``'s main
    thread so far, from /proc/PID/schedstat (Linux); None where it cannot be read. The second is how
    slow the machine was to it: a process asleep (a socket read) waits in neither."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            run_ns, wait_ns = f.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


def run_task(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Call `fn(*args, **kwargs)`; await the result if the function is a coroutine function."""
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):

        async def _await() -> Any:
            return await value

        value = asyncio.run(_await())
    return value


class _PipeClock:
    """The deadline clock of the item a worker runs: pausing tells the parent (see the docstring)."""

    def __init__(self, conn: Connection, request_id: int) -> None:
        self.conn, self.request_id = conn, request_id

    def pause(self, budgeted: bool = True) -> None:
        self.conn.send_bytes(pickle.dumps((self.request_id, PAUSED if budgeted else PAUSED_UNBUDGETED)))

    def resume(self) -> None:
        self.conn.send_bytes(pickle.dumps((self.request_id, RESUMED)))


def worker_main(conn: Connection, initializer: Callable[[], Any] | None = None) -> None:
    die_with_parent()
    become_subreaper()  # what its calls start stays below it, detached or not: its pool ends it (process_tree.py)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):  # Ctrl-C and a cluster's stop reach the
        signal.signal(sig, lambda signum, frame: None)  # whole process group: the trainer decides (train/stopping.py);
        # a no-op handler, not SIG_IGN, so that programs a reward starts get the default back at exec
    if initializer is not None:  # warm-up (imports, parser set-up) before the first task's deadline runs
        try:
            initializer()
        except BaseException:  # noqa: BLE001 - the tasks meet the same fault and report it
            pass
    try:
        conn.send_bytes(pickle.dumps((READY, True, None, None, False)))
    except OSError:  # the pool closed while this worker warmed up
        return
    while True:
        try:
            request_id, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            fn, args, kwargs = pickle.loads(payload)  # imports the reward's module: start-up, not the item
            conn.send_bytes(pickle.dumps((request_id, STARTED)))
            with deadline_clock(_PipeClock(conn, request_id)):
                reply = (request_id, True, run_task(fn, args, kwargs), None, False)
        except BaseException as exc:  # contained: the parent decides what a failure means
            fatal = isinstance(exc, RewardInfrastructureError)
            reply = (request_id, False, None, f"{type(exc).__name__}: {exc}", fatal)
        try:
            conn.send_bytes(pickle.dumps(reply))
        except Exception as exc:  # e.g. an unpicklable return value
            conn.send_bytes(pickle.dumps((request_id, False, None, f"result could not be sent back: {exc}", False)))
