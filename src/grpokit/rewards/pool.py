"""A small pool of worker processes whose tasks can be cut off, safe to share between threads.

Why not `concurrent.futures.ProcessPoolExecutor`? Its futures cannot be cancelled once running, so one
pathological input (a power tower handed to sympy, a reward function stuck in a C loop) would hold a
worker forever. Here every task has a deadline; when it passes, the worker is killed with SIGKILL and a
fresh one takes its place, so later tasks still run.

Design notes:
- Workers are started with the "spawn" method: a fresh small interpreter, never an `os.fork` of the
  (possibly huge, multi-threaded) trainer process. Spawn re-imports the main script in every worker,
  which is why a script that does its work at import time (no `if __name__ == "__main__":` guard)
  cannot start workers.
- Each worker asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG), so a crashed trainer
  leaves no busy orphans behind (workers are started from one process-long thread, since the signal
  follows the starting thread); a worker found dead while idle is replaced; every pool still open at interpreter exit is
  closed by an atexit hook, so a script that never calls `close()` exits promptly instead of waiting on idle workers
  forever.
- Many threads may call `run` on one pool at once (the reward runner calls unpicklable reward functions
  from threads, and they share the process-wide math-verify pool). A call checks out idle workers, so
  one worker serves one call at a time, and every request carries an id that the reply must echo: a
  reply can only reach the call, and the position, that asked for it.
- Failures of the pool itself are not items' failures: a worker that exits before it is ready, or
  workers that die on `max_deaths_in_a_row` tasks in a row, raise `RewardInfrastructureError` with the
  cause and the fix, instead of scoring every item 0.0. A timeout or an exception inside a task is
  contained in that task's `Outcome`.
- A task is `(function, args, kwargs)`; the function must be picklable (defined at module level).
  Coroutine functions are run to completion with `asyncio.run` inside the worker. A task that raises
  `RewardInfrastructureError` returns an Outcome with `fatal=True`.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import inspect
import itertools
import multiprocessing as mp
import pickle
import queue
import signal
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from .errors import RewardInfrastructureError


@dataclass(frozen=True)
class Outcome:
    """What happened to one task: `ok` with a `value`, or an `error` text (`timed_out` when cut off).

    `fatal` marks a task that raised `RewardInfrastructureError`: its caller must stop, not count it.
    """

    ok: bool
    value: Any = None
    error: str | None = None
    timed_out: bool = False
    fatal: bool = False


Task = tuple[Callable[..., Any], tuple, dict]
START_TIMEOUT_S = 120.0  # a spawned worker re-imports the main script (maybe torch): allow for a slow disk
_READY = -1  # request id of the hello a worker sends once it can take tasks


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


def _worker_main(conn: Connection, initializer: Callable[[], Any] | None = None) -> None:
    _die_with_parent()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):  # Ctrl-C and a cluster's stop reach the
        signal.signal(sig, lambda signum, frame: None)  # whole process group: the trainer decides (train/stopping.py);
        # a no-op handler, not SIG_IGN, so that programs a reward starts get the default back at exec
    if initializer is not None:  # warm-up (imports, parser set-up) before the first task's deadline runs
        try:
            initializer()
        except BaseException:  # noqa: BLE001 - the tasks meet the same fault and report it
            pass
    try:
        conn.send_bytes(pickle.dumps((_READY, True, None, None, False)))
    except OSError:  # the pool closed while this worker warmed up
        return
    while True:
        try:
            request_id, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            fn, args, kwargs = pickle.loads(payload)
            reply = (request_id, True, run_task(fn, args, kwargs), None, False)
        except BaseException as exc:  # contained: the parent decides what a failure means
            fatal = isinstance(exc, RewardInfrastructureError)
            reply = (request_id, False, None, f"{type(exc).__name__}: {exc}", fatal)
        try:
            conn.send_bytes(pickle.dumps(reply))
        except Exception as exc:  # e.g. an unpicklable return value
            conn.send_bytes(pickle.dumps((request_id, False, None, f"result could not be sent back: {exc}", False)))


_spawner: "queue.Queue[tuple[Callable[[], Any], list, threading.Event]] | None" = None
_spawner_lock = threading.Lock()


def _spawner_loop(requests: "queue.Queue[tuple[Callable[[], Any], list, threading.Event]]") -> None:
    while True:
        fn, box, done = requests.get()
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed back to the caller
            box.append((False, exc))
        done.set()


def _in_spawner_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` in one thread that lives as long as the process.

    PR_SET_PDEATHSIG fires when the *thread* that started the child ends, not the process: a worker
    started from a short-lived thread (a reward runner's thread pool) would be killed with it. Starting
    every worker from this thread ties the workers' lives to the process, as intended.
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = queue.Queue()
            threading.Thread(target=_spawner_loop, args=(_spawner,), name="grpokit-pool-spawner", daemon=True).start()
    box: list = []
    done = threading.Event()
    _spawner.put((fn, box, done))
    done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


class _Worker:
    def __init__(self, ctx: Any, initializer: Callable[[], Any] | None = None) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, initializer), daemon=False)
        _in_spawner_thread(self.proc.start)
        child.close()
        self.ready = False

    def wait_ready(self, timeout_s: float, name: str) -> None:
        """Block until the worker's hello arrives; raise RewardInfrastructureError if it never does."""
        if self.ready:
            return
        try:
            if self.conn.poll(timeout_s) and pickle.loads(self.conn.recv_bytes())[0] == _READY:
                self.ready = True
                return
            why = f"was not ready after {timeout_s:g} s"
        except (EOFError, OSError):
            self.proc.join(timeout=5)
            why = f"exited with code {self.proc.exitcode} before it was ready"
        self.kill()
        raise RewardInfrastructureError(
            f"The {name} worker process {why}: it is started with the 'spawn' method, which re-imports "
            'your main script, so put the script\'s work under `if __name__ == "__main__":` (or, if the '
            "script is guarded, read the worker's traceback above)."
        )

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


_OPEN_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    # Registered after multiprocessing's own exit hook, so it runs first: idle workers blocked on
    # recv() get EOF and exit, instead of multiprocessing joining them forever.
    for pool in list(_OPEN_POOLS):
        pool.close()


class WorkerPool:
    """`num_workers` spawned processes running tasks with a hard per-task timeout.

    Use `run(tasks, timeout_s)`; it returns one `Outcome` per task, in order, and may be called from
    several threads at once. Close with `close()` or use the pool as a context manager.

    name: what the workers do, for error messages ("math-verify", "reward").
    max_deaths_in_a_row: raise RewardInfrastructureError when this many tasks in a row (over the
        whole pool, no task finishing in between) end with their worker dead.
    initializer: a picklable function each worker runs once before it says it is ready (a warm-up:
        imports, caches), within ``start_timeout_s`` and outside every task's deadline.
    """

    def __init__(
        self,
        num_workers: int,
        name: str = "reward",
        max_deaths_in_a_row: int = 5,
        start_timeout_s: float = START_TIMEOUT_S,
        initializer: Callable[[], Any] | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}.")
        if max_deaths_in_a_row < 1:
            raise ValueError(f"max_deaths_in_a_row must be >= 1, got {max_deaths_in_a_row}.")
        self.name = name
        self.max_deaths_in_a_row = max_deaths_in_a_row
        self.start_timeout_s = start_timeout_s
        self._ctx = mp.get_context("spawn")
        self._initializer = initializer
        self._cond = threading.Condition()
        self._idle = [_Worker(self._ctx, initializer) for _ in range(num_workers)]
        self._size = num_workers
        self._ids = itertools.count()
        self._deaths_in_a_row = 0
        self._closed = False
        self._broken: str | None = None  # set when a worker could not start: every later call raises it
        self.restarts = 0  # how many workers were killed and replaced (timeouts or crashes)
        _OPEN_POOLS.add(self)

    # -- checking workers out and in (one worker serves one call at a time) ---------------------------
    def _checkout(self, block: bool) -> _Worker | None:
        with self._cond:
            while not self._idle and not self._broken:
                if self._closed:
                    raise RuntimeError(f"the {self.name} worker pool is closed.")
                if not block:
                    return None
                self._cond.wait()
            if self._broken:  # workers that cannot start once will not start the next time either
                raise RewardInfrastructureError(self._broken)
            if self._closed:
                raise RuntimeError(f"the {self.name} worker pool is closed.")
            worker = self._idle.pop()
        if worker.ready and not worker.proc.is_alive():  # died while idle (OOM killer, a stray signal)
            worker = self._replace(worker)
        try:
            worker.wait_ready(self.start_timeout_s, self.name)
        except RewardInfrastructureError as exc:
            with self._cond:
                self._broken = str(exc)
                self._cond.notify_all()
            raise
        return worker

    def _checkin(self, worker: _Worker) -> None:
        with self._cond:
            if self._closed:
                worker.kill()
                return
            self._idle.append(worker)
            self._cond.notify()

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        with self._cond:
            self.restarts += 1
        return _Worker(self._ctx, self._initializer)

    def _died(self, code: int | None) -> None:
        with self._cond:
            self._deaths_in_a_row += 1
            deaths = self._deaths_in_a_row
        if deaths >= self.max_deaths_in_a_row:
            raise RewardInfrastructureError(
                f"The {self.name} worker processes died on {deaths} tasks in a row (last exit code {code}), so "
                "every score would be made up: look for an out-of-memory kill (dmesg) or a crashing native "
                "library, and fix it before training."
            )

    # -- running tasks --------------------------------------------------------------------------------
    def run(self, tasks: list[Task], timeout_s: float) -> list[Outcome]:
        """One Outcome per task, in order; raises RewardInfrastructureError when the pool itself fails."""
        outcomes: list[Outcome | None] = [None] * len(tasks)
        pending = list(range(len(tasks)))[::-1]
        busy: dict[Connection, tuple[_Worker, int, int, float]] = {}  # conn -> (worker, task, id, deadline)
        try:
            while pending or busy:
                while pending:  # hand out tasks: wait for a worker only when this call holds none
                    worker = self._checkout(block=not busy)
                    if worker is None:
                        break
                    i = pending.pop()
                    try:
                        payload = pickle.dumps(tasks[i])
                    except Exception as exc:
                        outcomes[i] = Outcome(False, error=f"task could not be pickled: {exc}")
                        self._checkin(worker)
                        continue
                    request_id = next(self._ids)
                    try:
                        worker.conn.send_bytes(pickle.dumps((request_id, payload)))
                    except OSError:  # it died after checkout: this task's failure, the pool keeps a worker
                        worker.proc.join(timeout=5)
                        outcomes[i] = Outcome(False, error=f"worker process died (exit code {worker.proc.exitcode})")
                        self._checkin(self._replace(worker))
                        continue
                    busy[worker.conn] = (worker, i, request_id, time.monotonic() + timeout_s)
                if not busy:
                    continue
                next_deadline = min(d for _, _, _, d in busy.values())
                for conn in wait(list(busy), timeout=max(0.0, next_deadline - time.monotonic())):
                    worker, i, request_id, _ = busy.pop(conn)  # type: ignore[index]
                    try:
                        reply_id, ok, value, error, fatal = pickle.loads(worker.conn.recv_bytes())
                    except (EOFError, OSError):
                        worker.proc.join(timeout=5)  # EOF comes as it exits, maybe before it is reaped
                        code = worker.proc.exitcode
                        outcomes[i] = Outcome(False, error=f"worker process died (exit code {code})")
                        self._checkin(self._replace(worker))
                        self._died(code)
                        continue
                    if reply_id != request_id:  # cannot happen with one caller per worker; never trust it
                        outcomes[i] = Outcome(False, error=f"reply {reply_id} arrived for request {request_id}")
                        self._checkin(self._replace(worker))
                        continue
                    with self._cond:
                        self._deaths_in_a_row = 0
                    outcomes[i] = Outcome(ok, value, error, fatal=fatal)
                    self._checkin(worker)
                now = time.monotonic()
                for conn, (worker, i, _, deadline) in list(busy.items()):
                    if now >= deadline:
                        busy.pop(conn)
                        outcomes[i] = Outcome(False, error=f"timed out after {timeout_s:g} s", timed_out=True)
                        self._checkin(self._replace(worker))
        finally:  # an exception (or KeyboardInterrupt) leaves no worker with a reply nobody will read
            for worker, _, _, _ in busy.values():
                self._checkin(self._replace(worker))
        return [o if o is not None else Outcome(False, error="not run") for o in outcomes]

    def close(self) -> None:
        """Stop the workers (idle ones exit on EOF; busy ones are killed when their call returns)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        _OPEN_POOLS.discard(self)
        for worker in idle:
            worker.conn.close()  # the worker sees EOF and exits
        for worker in idle:
            worker.proc.join(timeout=2)
            if worker.proc.is_alive():
                worker.proc.kill()
                worker.proc.join(timeout=2)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
