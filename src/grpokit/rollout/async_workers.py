"""Rollout worker processes with deadlines: the pool behind ``rollout.async_workers`` (rollout/async_process.py).

Each worker is a process forked from a clean forkserver, holding its own sampling copy of the policy.
The frozen tensors of that copy are the trainer's, shared once through torch.multiprocessing's shared
memory; a job names a batch, its weights version and the trainable tensors of that version (shared-memory
tensors of the trainer's snapshot, passed as handles, not bytes), and the worker copies them into its own
parameters only when the version changed. A worker answers each job twice: ``synced`` once its weights
are that version, then the batch. Both answers have a deadline (``rollout.async_timeout_s``), and so
does the start. With partial rollouts a job also needs later versions: ``push`` sends each one as it is
published, the worker answers ``synced`` at every segment, and a worker waiting for a version not yet
published has no deadline until it is pushed (the wait is the trainer's; rollout/async_worker.py).

A fault is a worker that dies (its pipe closes and its process sentinel fires; said with its exit code or
signal), misses a deadline (it is killed: a hang, SIGSTOP, a sync that does not finish), raises, or returns a
batch that fails ``check`` (garbage). Each is counted and named in one sentence;
``rollout.async_worker_fault=stop`` ends the run with it, ``drop`` removes the worker and gives its batch to
another one, redone from its start (a batch's result does not depend on the worker: rollout/async_plan.py),
and stops only when no worker is left. Nothing waits without a deadline: if the trainer needs a batch whose
worker died while every other worker waits for a version only that batch's update will publish, one of them
gives its own batch back (``abandon``) and takes it.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing import resource_sharer
from multiprocessing.connection import wait
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

from grpokit.config.main_guard import GUARD

from .async_worker import worker_main

START_S = 300.0
"""The least deadline of a worker's start (a spawned interpreter importing torch on a busy machine)."""


SENDER_POLL_S = 1.0
"""How often the pool looks at its remote workers' weight senders (rollout/async_remote.py) for a failure."""

EXIT_WAIT_S = 2.0
"""How long a local worker whose pipe closed is waited for to end, so that its exit code or signal is said."""


class RolloutWorkerError(RuntimeError):
    """A rollout worker's fault that stops the run (its message is one sentence naming the worker)."""


@dataclass
class Job:
    index: int  # the batch
    version: int  # the weights version it is sampled with (with partial rollouts: its first segment's)
    tensors: dict[str, torch.Tensor]  # that version's trainable tensors (shared memory)
    prompts: list
    needs: tuple[int, ...] = ()  # the later versions its segments are drawn by (partial rollouts)
    later: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # those published: their tensors


@dataclass
class Worker:
    number: int
    proc: Any
    conn: Any
    job: Job | None = None
    deadline: float = 0.0
    phase: str = "start"  # start, sync, sample, wait (for a version not yet published), abandon, idle
    segment: int = 0  # the segment it samples (partial rollouts)
    at: int = 0  # that segment's version
    waiting: int | None = None  # the version it said it waits for, until it has loaded it
    threads: int = 0  # its intra-op CPU threads, as it said when ready

    @property
    def host(self) -> str:
        """A remote worker's host (rollout/async_remote.py RemoteProc); "" for a local one."""
        return getattr(self.proc, "host", "")

    def label(self) -> str:
        pid = "" if self.proc.pid is None else f"pid {self.proc.pid}"  # a remote one's, once it said it
        where = f"on {self.host}" if self.host else ""
        return f"rollout worker {self.number} ({' '.join(filter(None, (pid, where)))})"


@dataclass
class PoolStats:
    faults: int = 0
    dropped: list[str] = field(default_factory=list)  # one sentence per dropped worker
    given_back: int = 0  # batches a waiting worker gave back for an earlier one (``WorkerPool._unblock``)


def exit_said(code: int | None) -> str:
    """How a process ended, from its exit code (negative: the signal that killed it)."""
    return f"was killed by {signal.Signals(-code).name}" if code and code < 0 else f"exited with code {code}"


def quiet_handle_sharer() -> None:
    """Drop the traceback of a worker that died while fetching a file descriptor. The trainer's shared tensors
    reach a worker as descriptors that multiprocessing's resource_sharer thread hands over when the worker asks;
    a worker killed mid-handover leaves that thread a broken connection, which it prints through sys.excepthook
    (a ConnectionResetError traceback before the pool's one sentence about the death) and goes on serving. Such
    errors, on that thread only, are dropped; every other exception reaches the hook that was there."""
    previous = sys.excepthook
    if getattr(previous, "grpokit_quiet_sharer", False):  # installed once a process
        return

    def hook(kind, value, tb) -> None:
        sharer = getattr(resource_sharer._resource_sharer, "_thread", None)
        if issubclass(kind, (ConnectionError, EOFError)) and sharer is threading.current_thread():
            return
        previous(kind, value, tb)

    hook.grpokit_quiet_sharer = True
    sys.excepthook = hook


def _send_init(sends: list[tuple[Any, dict]]) -> None:
    """Each ``(conn, init record)``: the record down the pipe; a worker that died before reading it is found by its
    sentinel."""
    for conn, init in sends:
        try:
            conn.send(init)
        except (OSError, ValueError):
            pass


class WorkerPool:
    """``n`` worker processes sampling whole batches; ``submit`` queues a job, ``result(index)`` waits
    (with deadlines) for that batch, dispatching queued jobs as workers free up."""

    def __init__(
        self,
        n: int,
        init: dict,
        *,
        timeout_s: float,
        on_fault: str,
        check: Callable[[Job, Any], str],
        remote: list = (),
        remote_init: dict | None = None,
    ):
        """``n`` local workers, and the ``remote`` ones, ``(conn, proc)`` pairs already connected
        (rollout/async_remote.py), numbered after them, which receive ``remote_init`` (default ``init``)."""
        self.timeout_s, self.on_fault, self.check = timeout_s, on_fault, check
        # forkserver: one clean server process imports torch and grpokit's sampler once, and forks each worker
        # from it (a plain fork would copy the trainer's threads and locks; spawn re-imports everything)
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(["grpokit.rollout.async_process", type(init["model"]).__module__])
        quiet_handle_sharer()  # a worker's death is said once, in the pool's sentence
        self.stats = PoolStats()
        self.queue: list[Job] = []
        self.results: dict[int, Any] = {}
        self.sync_s = 0.0  # weight-sync seconds the workers reported since the last take
        self.sampled_s: dict[int, float] = {}  # batch index -> seconds its worker spent sampling it
        self.workers: list[Worker] = []
        for k in range(n):
            parent, child = self.ctx.Pipe()
            proc = self.ctx.Process(target=worker_main, args=(child,), name=f"grpokit-rollout-{k}", daemon=True)
            proc.start()
            child.close()
            # starting imports torch in a fresh interpreter: its own, longer deadline
            self.workers.append(Worker(k, proc, parent, deadline=time.monotonic() + max(timeout_s, START_S)))
        for conn, proc in remote:  # receiving the policy by value over the network: the same start deadline
            start = time.monotonic() + max(timeout_s, START_S)
            self.workers.append(Worker(len(self.workers), proc, conn, deadline=start))
        # the init record goes through the pipes from a thread, so a worker that never reads it meets its start
        # deadline instead of blocking the trainer; every worker has read it once all are ready (below)
        sends = [(w.conn, init if k < n else remote_init or init) for k, w in enumerate(self.workers)]
        threading.Thread(target=_send_init, args=(sends,), daemon=True).start()
        try:
            while any(w.phase == "start" for w in self.workers):
                self._pump()
        except BaseException:  # a worker that cannot start: the others end with it, none is left behind
            self.close()
            raise

    def submit(self, job: Job) -> None:
        self.queue.append(job)
        self._dispatch()

    def push(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        """A version just published: to each busy worker whose batch needs it (it may wait for it at a
        segment boundary), and into the queued jobs that need it."""
        for job in self.queue:
            if version in job.needs:
                job.later[version] = tensors
        for w in list(self.workers):
            if w.job is None or version not in w.job.needs or version in w.job.later:
                continue
            w.job.later[version] = tensors  # a redo elsewhere carries it in its job
            if w.phase == "wait":  # its wait is over: its own deadline again
                w.phase, w.deadline = "sample", time.monotonic() + self.timeout_s
            try:
                w.conn.send(("version", version, tensors))
            except OSError:  # it died: its sentinel says so at the next wait, before the next update
                pass

    def result(self, index: int) -> tuple[Any, float]:
        """Batch ``index``'s rollout and the seconds waited on a straggler: while other workers sat idle
        with later batches done."""
        straggling = 0.0
        while index not in self.results:
            self._unblock(index)
            t0 = time.monotonic()
            later_done = any(j > index for j in self.results)
            self._pump()
            straggling += (time.monotonic() - t0) if later_done else 0.0
        return self.results.pop(index), straggling

    def _unblock(self, index: int) -> None:
        """Batch ``index`` queued (its worker died) while no worker is idle: a worker waiting for a version
        that only the trainer's next update publishes gives its later batch back and takes this one (else
        both would wait for each other)."""
        if all(j.index != index for j in self.queue) or any(w.phase == "idle" for w in self.workers):
            return
        w = next((w for w in self.workers if w.phase == "wait"), None)
        if w is None:
            return
        try:
            w.conn.send(("abandon", w.job.index))
        except OSError as e:  # it died while waiting: its end of the pipe is closed
            return self._fault(w, self._closed(w, e, f"{self._doing(w)} (found when told to give it back)"))
        self._requeue(w.job)
        self.stats.given_back += 1
        w.job, w.phase, w.deadline = None, "abandon", time.monotonic() + self.timeout_s

    def _requeue(self, job: Job) -> None:
        self.queue.append(job)
        self.queue.sort(key=lambda j: j.index)

    def _dispatch(self) -> None:
        for w in list(self.workers):
            if w.phase == "idle" and self.queue:
                w.job = self.queue.pop(0)
                w.phase, w.deadline = "sync", time.monotonic() + self.timeout_s
                w.segment, w.at, w.waiting = 0, w.job.version, None
                try:
                    w.conn.send(w.job)
                except OSError as e:  # it died while idle: its end of the pipe is closed
                    self._fault(w, self._closed(w, e, f"while idle (found when it was sent batch {w.job.index})"))

    def _pump(self) -> None:
        """Handle what one wait brings: a message, a death, or a missed deadline."""
        self._dispatch()
        if not self.workers:
            raise RolloutWorkerError(
                "no rollout worker is left (rollout.async_workers, rollout.async_remote_workers): "
                + "; ".join(self.stats.dropped)
            )
        busy = [w for w in self.workers if w.phase != "idle"]
        if not busy:
            raise RolloutWorkerError("the rollout workers have no batch to sample (grpokit's own fault)")
        timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
        if math.isinf(timeout):
            raise RolloutWorkerError(
                "every busy rollout worker waits for weights the trainer has not published (grpokit's own fault)"
            )
        if any(w.host for w in busy):  # a remote worker's weights go from a thread, which may fail between messages
            timeout = min(timeout, SENDER_POLL_S)
        sentinels = [w.proc.sentinel for w in busy if w.proc.sentinel is not None]  # a remote worker has none
        ready = wait([w.conn for w in busy] + sentinels, timeout=timeout)
        for w in busy:
            sender_failed = w.host and w.conn.error is not None
            # the pipe first: a batch sent just before a death is still taken. A local worker's death closes both at
            # once; its EOF then waits for the exit code (_receive), so the sentence says the signal all the same
            if w.conn in ready or (sender_failed and w.conn.poll(0)):
                self._receive(w)
            elif w.proc.sentinel is not None and w.proc.sentinel in ready:
                self._fault(w, f"{exit_said(w.proc.exitcode)} {self._doing(w)}")
            elif time.monotonic() >= w.deadline:
                limit = f"rollout.async_timeout_s={self.timeout_s:g} s" if w.phase != "start" else "its start deadline"
                self._fault(w, f"did not {self._task(w)} within {limit} (hung or stopped)")
            elif sender_failed:
                self._sender_fault(w)
        self._dispatch()

    def _sender_fault(self, w: Worker) -> None:
        """A remote worker's weights could not be sent (rollout/async_remote.py RemoteConn's thread failed)."""
        e = w.conn.error
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        self._fault(w, f"could not be sent weights through its gloo pair {self._doing(w)} ({why})")

    def _receive(self, w: Worker) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError) as e:
            return self._fault(w, self._closed(w, e, self._doing(w)))
        kind = msg[0] if isinstance(msg, tuple) and msg else None
        if kind == "ready" and w.phase == "start":
            w.phase, w.threads = "idle", int(msg[2])
            if w.host:  # a remote process's pid is known only from what it says
                w.proc.pid = int(msg[1])
        elif kind == "synced" and w.phase in ("sync", "sample", "wait") and msg[1] == w.job.index:
            self.sync_s += float(msg[4])
            w.segment, w.at, w.waiting = msg[2], msg[3], None
            w.phase, w.deadline = "sample", time.monotonic() + self.timeout_s
        elif kind == "waiting" and w.phase == "sample" and msg[1] == w.job.index:
            if msg[2] not in w.job.later:  # not published yet: the wait is the trainer's, no deadline
                w.phase, w.deadline = "wait", math.inf
            w.waiting = msg[2]
        elif kind == "abandoned" and w.phase == "abandon":
            w.phase = "idle"
        elif kind == "batch" and w.phase == "sample" and msg[1] == w.job.index:
            problem = self.check(w.job, msg[2])
            if problem:
                return self._fault(w, f"returned a malformed batch {w.job.index}: {problem}")
            self.results[w.job.index] = msg[2]
            self.sampled_s[w.job.index] = float(msg[3]) if len(msg) > 3 else math.nan
            w.job, w.phase = None, "idle"
        elif kind == "error" and w.host and w.conn.error is not None:  # its receive failed: the sender's cause
            self._sender_fault(w)
        elif kind == "error":
            self._fault(w, f"failed on batch {msg[1]}: {msg[2]}")
        else:
            self._fault(w, f"sent an unexpected message {self._doing(w)}: {str(msg)[:80]!r}")

    def _closed(self, w: Worker, e: BaseException, doing: str) -> str:
        """Why a worker's connection closed (``e``) while ``doing``: a local worker's exit code or signal (it is
        waited for up to EXIT_WAIT_S), else the connection itself (a remote worker: no process to wait for)."""
        if not w.host:
            w.proc.join(timeout=EXIT_WAIT_S)
            if w.proc.exitcode is not None:
                return f"{exit_said(w.proc.exitcode)} {doing}"
        return f"closed its connection {doing} ({type(e).__name__})"

    def _task(self, w: Worker) -> str:
        if w.phase == "start":
            return f"start ({max(self.timeout_s, START_S):g} s)"
        if w.phase == "abandon":
            return "give back the batch it was told to"
        if w.phase == "sync":
            return f"load the weights of version {w.job.version} for batch {w.job.index}"
        if w.waiting is not None:
            return f"load version {w.waiting} for segment {w.segment + 1} of batch {w.job.index}"
        if w.job.needs:
            return (
                f"finish segment {w.segment} of batch {w.job.index} (version {w.at}) or load the next segment's weights"
            )
        return f"finish sampling batch {w.job.index}"

    def _doing(self, w: Worker) -> str:
        if w.phase == "abandon":
            return "while giving a batch back"
        if w.job is None:
            return "while starting"
        if w.waiting is not None:  # once the version is pushed, the trainer cannot tell waiting from loading
            how = "waiting for" if w.phase == "wait" else "waiting for or loading"
            return f"while {how} version {w.waiting} for segment {w.segment + 1} of batch {w.job.index}"
        if w.job.needs and w.phase == "sample":
            return f"while sampling segment {w.segment} of batch {w.job.index} (version {w.at})"
        return f"while working on batch {w.job.index}"

    def _fault(self, w: Worker, what: str) -> None:
        self.stats.faults += 1
        sentence = f"{w.label()} {what}"
        if w.phase == "start" and not w.host:  # a local worker's start runs the main script again (forkserver)
            sentence += f"; each worker runs the main script again as it starts: if it trains at its top level, {GUARD}"
        self._end(w)
        self.workers.remove(w)
        if w.job is not None:
            self._requeue(w.job)  # another worker samples it from its start: the result does not depend on which
        if self.on_fault == "stop" or not self.workers:
            raise RolloutWorkerError(sentence + (" (rollout.async_worker_fault=stop)" if self.workers else ""))
        self.stats.dropped.append(sentence)
        print(
            f"grpokit: {sentence}; dropped it, {len(self.workers)} left (rollout.async_worker_fault=drop)", flush=True
        )

    @staticmethod
    def _end(w: Worker) -> None:
        if w.proc.is_alive():
            w.proc.kill()  # SIGKILL works on a stopped process too
        w.proc.join(timeout=10)
        w.conn.close()

    def close(self) -> None:
        for w in self.workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        for w in self.workers:
            w.proc.join(timeout=5)
            self._end(w)
        self.workers = []
