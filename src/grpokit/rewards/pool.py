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
- Deadlines measure the task (docs/FAULTS.md, "Deadlines measure the call"): a task's clock starts
  when its worker says it began it (rewards/pool_worker.py), stops while the task runs start-up
  (grpokit.rewards.calls), and, with ``cpu_budget``, counts the worker's CPU seconds. A task whose
  worker died, that no worker began within ``start_timeout_s``, or that ran out of time only because
  the machine was slow, is retried once after the call's other tasks; ``Outcome.kind`` says what the
  final failure was.
- Failures of the pool itself are not items' failures: a worker that exits before it is ready, or
  workers that die on `max_deaths_in_a_row` tasks in a row, raise `RewardInfrastructureError` with the
  cause and the fix, instead of scoring every item 0.0. A timeout or an exception inside a task is
  contained in that task's `Outcome`.
- A task is `(function, args, kwargs)`; the function must be picklable (defined at module level).
  Coroutine functions are run to completion with `asyncio.run` inside the worker. A task that raises
  `RewardInfrastructureError` returns an Outcome with `fatal=True`.
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing as mp
import os
import pickle
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from grpokit.config.main_guard import GUARD

from .calls import startup
from .errors import RewardInfrastructureError
from .pool_worker import PAUSED, PAUSED_UNBUDGETED, READY, RESUMED, STARTED, sched_times, worker_main
from .process_tree import end_below
from .spawner import in_spawner_thread


@dataclass(frozen=True)
class Outcome:
    """What happened to one task: `ok` with a `value`, or an `error` text (`timed_out` when cut off).

    `fatal` marks a task that raised `RewardInfrastructureError`: its caller must stop, not count it.
    `kind` names a failure that is not the function's own exception: "timeouts" (the task's own work ran
    past its deadline), "crashes" (its worker died on it twice) or "machine" (no worker began it within
    the start-up budget, twice); see `grpokit.rewards.calls` for what each scores.
    """

    ok: bool
    value: Any = None
    error: str | None = None
    timed_out: bool = False
    fatal: bool = False
    kind: str | None = None


Task = tuple[Callable[..., Any], tuple, dict]
START_TIMEOUT_S = 120.0  # a spawned worker re-imports the main script (maybe torch): allow for a slow disk
WALL_FACTOR = 10.0  # a CPU-budgeted task starved this many times its budget in wall time: the machine is slow
_POLL_S = 0.05  # how often a CPU-budgeted task's CPU time is read


class _Worker:
    def __init__(self, ctx: Any, initializer: Callable[[], Any] | None = None) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=worker_main, args=(child, initializer), daemon=False)
        in_spawner_thread(self.proc.start)
        _LIVE_PIDS.add(self.proc.pid)
        child.close()
        self.ready = False

    def wait_ready(self, timeout_s: float, name: str) -> None:
        """Block until the worker's hello arrives; raise RewardInfrastructureError if it never does."""
        if self.ready:
            return
        try:
            if self.conn.poll(timeout_s) and pickle.loads(self.conn.recv_bytes())[0] == READY:
                self.ready = True
                return
            why = f"was not ready after {timeout_s:g} s"
        except (EOFError, OSError):
            self.proc.join(timeout=5)
            why = f"exited with code {self.proc.exitcode} before it was ready"
        self.kill()
        raise RewardInfrastructureError(
            f"The {name} worker process {why}: it is started with the 'spawn' method, which re-imports "
            f"your main script, so {GUARD} (or, if the script is guarded, read the worker's traceback above)."
        )

    def kill(self) -> None:
        if self.proc.is_alive():
            end_below(self.proc.pid)  # what its calls started, before they lose their place below it
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()
        _LIVE_PIDS.discard(self.proc.pid)


_OPEN_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()
_LIVE_PIDS: set[int] = set()  # pids of pool workers not yet ended (a run's reaper keeps them)


def live_worker_pids() -> set[int]:
    """The pids of this process's pool workers still running (kept by train/reaper.py at a run's end:
    the process-wide verifier pool serves the next run; the processes they started are not kept)."""
    return set(_LIVE_PIDS)


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
    cpu_budget: the deadline is CPU seconds of the worker, not wall time (a verifier: its work is CPU
        alone); a task still short of it after ``WALL_FACTOR`` times as long in wall time was starved by
        the machine and is retried once. Without it, a task past its wall-clock deadline that spent more
        than half of it waiting for a CPU (/proc/PID/schedstat) is the one retried.
    spares: workers kept started and warm beside the ``num_workers``: a worker killed at a deadline is
        replaced by a spare at once (its warm-up is not waited for in the batch's path).
    """

    def __init__(
        self,
        num_workers: int,
        name: str = "reward",
        max_deaths_in_a_row: int = 5,
        start_timeout_s: float = START_TIMEOUT_S,
        initializer: Callable[[], Any] | None = None,
        cpu_budget: bool = False,
        spares: int = 0,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}.")
        if max_deaths_in_a_row < 1:
            raise ValueError(f"max_deaths_in_a_row must be >= 1, got {max_deaths_in_a_row}.")
        self.name = name
        self.max_deaths_in_a_row = max_deaths_in_a_row
        self.start_timeout_s = start_timeout_s
        self.cpu_budget = cpu_budget and sched_times(os.getpid()) is not None
        self._ctx = mp.get_context("spawn")
        self._initializer = initializer
        self._cond = threading.Condition()
        with startup():
            self._idle = [_Worker(self._ctx, initializer) for _ in range(num_workers)]
            self._spares = [_Worker(self._ctx, initializer) for _ in range(spares)]
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
            if not block and not worker.ready and not worker.conn.poll(0):  # still starting: keep waiting on
                self._idle.insert(0, worker)  # the tasks in flight instead of blocking their deadlines
                return None
        if worker.ready and not worker.proc.is_alive():  # died while idle (OOM killer, a stray signal)
            worker = self._replace(worker)
        try:
            if not worker.ready:  # start-up: not part of the deadline of the call that waits for it
                with startup():
                    worker = self._ready_or_once_more(worker)
        except RewardInfrastructureError as exc:
            with self._cond:
                self._broken = str(exc)
                self._cond.notify_all()
            raise
        return worker

    def _ready_or_once_more(self, worker: _Worker) -> _Worker:
        """``worker`` once it is ready; one that does not start (a slow disk, a stray kill: the machine's
        fault) is replaced by a fresh one with a budget of its own. A second failure raises: workers that
        cannot start twice in a row will not start the next time either (an unguarded main script)."""
        try:
            worker.wait_ready(self.start_timeout_s, self.name)
            return worker
        except RewardInfrastructureError:
            fresh = _Worker(self._ctx, self._initializer)
            with self._cond:
                self.restarts += 1
            try:
                fresh.wait_ready(self.start_timeout_s, self.name)
            except RewardInfrastructureError as second:
                raise RewardInfrastructureError(f"{second} (Two workers in a row failed to start.)") from None
            return fresh

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
            spare = self._spares.pop(0) if self._spares else None
        with startup():
            fresh = _Worker(self._ctx, self._initializer)
        if spare is None:
            return fresh
        with self._cond:
            self._spares.append(fresh)
        return spare

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
        """One Outcome per task, in order; raises RewardInfrastructureError when the pool itself fails.

        A task's deadline starts when its worker says it began it (its module imported) and stops
        while the task runs start-up (``grpokit.rewards.calls.startup``). A task whose worker died,
        never began it within ``start_timeout_s``, or that ran out of time only because the machine
        was slow (see ``cpu_budget``) is retried once, after the batch's other tasks, on a ready worker."""
        call = _Call(self, tasks, timeout_s)
        try:
            while call.pending or call.busy:
                self._dispatch(call)
                if call.busy:
                    self._collect(call)
        finally:  # an exception (or KeyboardInterrupt) leaves no worker with a reply nobody will read
            for b in call.busy.values():
                self._checkin(self._replace(b.worker))
        return [o if o is not None else Outcome(False, error="not run") for o in call.outcomes]

    def _dispatch(self, call: "_Call") -> None:
        """Hand out pending tasks: wait for a worker only when this call holds none."""
        while call.pending:
            worker = self._checkout(block=not call.busy)
            if worker is None:
                return
            i = call.pending.pop()
            try:
                payload = pickle.dumps(call.tasks[i])
            except Exception as exc:
                call.outcomes[i] = Outcome(False, error=f"task could not be pickled: {exc}")
                self._checkin(worker)
                continue
            request_id = next(self._ids)
            try:
                worker.conn.send_bytes(pickle.dumps((request_id, payload)))
            except OSError:  # it died after checkout: the machine's failure, retried once
                worker.proc.join(timeout=5)
                call.retry_or(i, Outcome(False, error=f"worker process died (exit code {worker.proc.exitcode})"))
                self._checkin(self._replace(worker))
                continue
            call.busy[worker.conn] = _Busy(worker, i, request_id, time.monotonic())

    def _collect(self, call: "_Call") -> None:
        """Read what arrived (or wait until the next deadline), then cut off tasks past theirs."""
        now = time.monotonic()
        wake = min(self._next_check(b, call.timeout_s, now) for b in call.busy.values())
        for conn in wait(list(call.busy), timeout=max(0.0, wake - now)):
            b = call.busy[conn]  # type: ignore[index]
            try:
                message = pickle.loads(b.worker.conn.recv_bytes())
            except (EOFError, OSError):
                del call.busy[conn]  # type: ignore[arg-type]
                b.worker.proc.join(timeout=5)  # EOF comes as it exits, maybe before it is reaped
                code = b.worker.proc.exitcode
                self._checkin(self._replace(b.worker))
                call.retry_or(
                    b.index, Outcome(False, error=f"worker process died (exit code {code}) twice", kind="crashes")
                )
                self._died(code)
                continue
            if len(message) == 2:  # STARTED / PAUSED / RESUMED of the task in flight
                b.note(message[1])
                continue
            del call.busy[conn]  # type: ignore[arg-type]
            reply_id, ok, value, error, fatal = message
            if reply_id != b.request_id:  # cannot happen with one caller per worker; never trust it
                call.outcomes[b.index] = Outcome(False, error=f"reply {reply_id} arrived for request {b.request_id}")
                self._checkin(self._replace(b.worker))
                continue
            with self._cond:
                self._deaths_in_a_row = 0
            call.outcomes[b.index] = Outcome(ok, value, error, fatal=fatal)
            self._checkin(b.worker)
        now = time.monotonic()
        for conn, b in list(call.busy.items()):
            verdict = self._verdict(b, call.timeout_s, now)
            if verdict is None:
                continue
            del call.busy[conn]
            self._checkin(self._replace(b.worker))
            cut = Outcome(False, error=f"timed out after {call.timeout_s:g} s", timed_out=True, kind="timeouts")
            if verdict == "timeout":
                call.outcomes[b.index] = cut
            elif verdict == "slow":  # the machine was slow, not the task: once more, then it counts
                call.retry_or(b.index, cut)
            else:
                why = f"no {self.name} worker began the task within {self.start_timeout_s:g} s, twice"
                call.retry_or(b.index, Outcome(False, error=why, kind="machine"))

    def _next_check(self, b: "_Busy", timeout_s: float, now: float) -> float:
        if b.started is None or b.paused_at is not None:
            return (b.paused_at or b.sent) + self.start_timeout_s if b.budgeted else now + 1.0
        if self.cpu_budget and b.times0 is not None:
            return now + _POLL_S
        return b.started + b.paused_s + timeout_s

    def _verdict(self, b: "_Busy", timeout_s: float, now: float) -> str | None:
        """None (still within its time), "timeout" (its own work ran out), "slow" or "start" (the machine's)."""
        if b.started is None or b.paused_at is not None:
            late = b.budgeted and now - (b.paused_at or b.sent) > self.start_timeout_s
            return "start" if late else None
        elapsed = now - b.started - b.paused_s
        times = sched_times(b.worker.proc.pid) if b.times0 is not None else None
        ran, waited = (times[0] - b.times0[0], times[1] - b.times0[1]) if times and b.times0 else (0.0, 0.0)
        if self.cpu_budget and times is not None:
            if ran >= timeout_s:
                return "timeout"
            return "slow" if elapsed >= timeout_s * WALL_FACTOR else None
        if elapsed < timeout_s:
            return None
        # it waited for a CPU more than half its time: the machine was slow, not the task
        return "slow" if waited >= 0.5 * elapsed else "timeout"

    def close(self) -> None:
        """Stop the workers (idle ones exit on EOF; busy ones are killed when their call returns)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle + self._spares, []
            self._spares = []
            self._cond.notify_all()
        _OPEN_POOLS.discard(self)
        for worker in idle:
            end_below(worker.proc.pid)  # what its calls started and left running ends with the pool
            worker.conn.close()  # the worker sees EOF and exits
        for worker in idle:
            worker.proc.join(timeout=2)
            if worker.proc.is_alive():
                worker.proc.kill()
                worker.proc.join(timeout=2)
            _LIVE_PIDS.discard(worker.proc.pid)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Busy:
    """A task in flight: its worker, its place in the call, and its clock (see WorkerPool.run)."""

    worker: _Worker
    index: int
    request_id: int
    sent: float
    started: float | None = None  # when the worker said it began (its imports done)
    paused_at: float | None = None  # start-up under way inside the task (calls.startup)
    paused_s: float = 0.0
    budgeted: bool = True  # the pause is start-up (START_TIMEOUT_S), not a wait timed elsewhere
    times0: tuple[float, float] | None = None  # the worker's (run, wait) seconds when it began

    def note(self, what: str) -> None:
        now = time.monotonic()
        if what == STARTED:
            self.started, self.times0 = now, sched_times(self.worker.proc.pid)
        elif what in (PAUSED, PAUSED_UNBUDGETED) and self.paused_at is None:
            self.paused_at, self.budgeted = now, what == PAUSED
        elif what == RESUMED and self.paused_at is not None:
            self.paused_s += now - self.paused_at
            self.paused_at, self.budgeted = None, True
            if self.times0 is not None:  # start-up's CPU time is not the task's either
                self.times0 = sched_times(self.worker.proc.pid) or self.times0


class _Call:
    """The state of one `WorkerPool.run`: outcomes, tasks still to hand out, tasks in flight, retries."""

    def __init__(self, pool: WorkerPool, tasks: list[Task], timeout_s: float) -> None:
        self.tasks, self.timeout_s = tasks, timeout_s
        self.outcomes: list[Outcome | None] = [None] * len(tasks)
        self.pending = list(range(len(tasks)))[::-1]  # popped from the end: in order
        self.busy: dict[Connection, _Busy] = {}
        self.retried: set[int] = set()

    def retry_or(self, i: int, final: Outcome) -> None:
        """Task i failed for the machine's reason: queue it once more, after the others; else ``final``."""
        if i in self.retried:
            self.outcomes[i] = final
        else:
            self.retried.add(i)
            self.pending.insert(0, i)
