"""A small pool of worker processes whose tasks can be cut off.

Why not `concurrent.futures.ProcessPoolExecutor`? Its futures cannot be cancelled once running, so one
pathological input (a power tower handed to sympy, a reward function stuck in a C loop) would hold a
worker forever. Here every task has a deadline; when it passes, the worker is killed with SIGKILL and a
fresh one takes its place, so later tasks still run.

Design notes:
- Workers are started with the "spawn" method: a fresh small interpreter, never an `os.fork` of the
  (possibly huge, multi-threaded) trainer process.
- Each worker asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG), so a crashed trainer
  leaves no busy orphans behind.
- A task is `(function, args, kwargs)`; the function must be picklable (defined at module level).
  Coroutine functions are run to completion with `asyncio.run` inside the worker.
"""
from __future__ import annotations

import asyncio
import ctypes
import inspect
import multiprocessing as mp
import pickle
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable


@dataclass(frozen=True)
class Outcome:
    """What happened to one task: `ok` with a `value`, or an `error` text (`timed_out` when cut off)."""

    ok: bool
    value: Any = None
    error: str | None = None
    timed_out: bool = False


Task = tuple[Callable[..., Any], tuple, dict]


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_task(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Call `fn(*args, **kwargs)`; await the result if the function is a coroutine function."""
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        async def _await() -> Any:
            return await value

        value = asyncio.run(_await())
    return value


def _worker_main(conn: Connection) -> None:
    _die_with_parent()
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            fn, args, kwargs = pickle.loads(payload)
            reply = (True, run_task(fn, args, kwargs), None)
        except BaseException as exc:  # contained: the parent decides what a failure means
            reply = (False, None, f"{type(exc).__name__}: {exc}")
        try:
            conn.send_bytes(pickle.dumps(reply))
        except Exception as exc:  # e.g. an unpicklable return value
            conn.send_bytes(pickle.dumps((False, None, f"result could not be sent back: {exc}")))


class _Worker:
    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=False)
        self.proc.start()
        child.close()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class WorkerPool:
    """`num_workers` spawned processes running tasks with a hard per-task timeout.

    Use `run(tasks, timeout_s)`; it returns one `Outcome` per task, in order. Close with `close()` or use
    the pool as a context manager.
    """

    def __init__(self, num_workers: int) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}.")
        self._ctx = mp.get_context("spawn")
        self._workers = [_Worker(self._ctx) for _ in range(num_workers)]
        self.restarts = 0  # how many workers were killed and replaced (timeouts or crashes)

    def run(self, tasks: list[Task], timeout_s: float) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(tasks)
        pending = list(range(len(tasks)))[::-1]
        busy: dict[int, tuple[int, float]] = {}  # worker index -> (task index, deadline)
        while pending or busy:
            for w in range(len(self._workers)):
                if w not in busy and pending:
                    i = pending.pop()
                    try:
                        payload = pickle.dumps(tasks[i])
                    except Exception as exc:
                        outcomes[i] = Outcome(False, error=f"task could not be pickled: {exc}")
                        continue
                    self._workers[w].conn.send_bytes(payload)
                    busy[w] = (i, time.monotonic() + timeout_s)
            if not busy:
                continue
            next_deadline = min(d for _, d in busy.values())
            conns = {self._workers[w].conn: w for w in busy}
            ready = wait(list(conns), timeout=max(0.0, next_deadline - time.monotonic()))
            for conn in ready:
                w = conns[conn]  # type: ignore[index]
                i, _ = busy.pop(w)
                try:
                    ok, value, error = pickle.loads(conn.recv_bytes())  # type: ignore[union-attr]
                    outcomes[i] = Outcome(ok, value, error)
                except (EOFError, OSError):
                    code = self._workers[w].proc.exitcode
                    outcomes[i] = Outcome(False, error=f"worker process died (exit code {code})")
                    self._replace(w)
            now = time.monotonic()
            for w, (i, deadline) in list(busy.items()):
                if now >= deadline:
                    busy.pop(w)
                    outcomes[i] = Outcome(False, error=f"timed out after {timeout_s:g} s", timed_out=True)
                    self._replace(w)
        return [o if o is not None else Outcome(False, error="not run") for o in outcomes]

    def _replace(self, w: int) -> None:
        self._workers[w].kill()
        self._workers[w] = _Worker(self._ctx)
        self.restarts += 1

    def close(self) -> None:
        for worker in self._workers:
            worker.conn.close()  # the worker sees EOF and exits
        for worker in self._workers:
            worker.proc.join(timeout=2)
            if worker.proc.is_alive():
                worker.proc.kill()
                worker.proc.join(timeout=2)
        self._workers = []

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
