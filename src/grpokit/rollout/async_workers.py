"""Rollout worker processes with deadlines: the pool behind ``rollout.async_workers`` (rollout/async_process.py).

Each worker is a process forked from a clean forkserver, holding its own sampling copy of the policy.
The frozen tensors of that copy are the trainer's, shared once through torch.multiprocessing's shared
memory; a job names a batch, its weights version and the trainable tensors of that version (shared-memory
tensors of the trainer's snapshot, passed as handles, not bytes), and the worker copies them into its own
parameters only when the version changed. A worker answers each job twice: ``synced`` once its weights
are that version, then the batch. Both answers have a deadline (``rollout.async_timeout_s``), and so
does the start.

A fault is a worker that dies (its process sentinel fires), misses a deadline (it is killed: a hang,
SIGSTOP, a sync that does not finish), raises, or returns a batch that fails ``check`` (garbage). Each is
counted and named in one sentence; ``rollout.async_worker_fault=stop`` ends the run with it, ``drop``
removes the worker and gives its batch to another one (a batch's result does not depend on the worker:
rollout/async_plan.py), and stops only when no worker is left. Nothing waits without a deadline.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

START_S = 300.0
"""The least deadline of a worker's start (a spawned interpreter importing torch on a busy machine)."""


class RolloutWorkerError(RuntimeError):
    """A rollout worker's fault that stops the run (its message is one sentence naming the worker)."""


@dataclass
class Job:
    index: int  # the batch
    version: int  # the weights version it is sampled with
    tensors: dict[str, torch.Tensor]  # that version's trainable tensors (shared memory)
    prompts: list


@dataclass
class Worker:
    number: int
    proc: Any
    conn: Any
    job: Job | None = None
    deadline: float = 0.0
    phase: str = "start"  # start, sync, sample, idle
    sync_s: float = 0.0


@dataclass
class PoolStats:
    faults: int = 0
    dropped: list[str] = field(default_factory=list)  # one sentence per dropped worker


def _worker_main(conn, init: dict) -> None:
    """A worker's life: load the init record, then answer jobs until told to stop (None)."""
    torch.set_num_threads(init["threads"])
    torch.use_deterministic_algorithms(init["deterministic"])
    model, sample, ctx = init["model"], init["sample"], init["context"]
    if init["onednn"]:  # the trainer's linears run through oneDNN: the same kernels, the same numbers
        from grpokit.nn.kernels import use_onednn_linears

        use_onednn_linears(model)
    params = dict(model.named_parameters())
    with torch.no_grad():  # the trainable tensors become this worker's own; the frozen ones stay shared
        for name in init["trainable"]:
            params[name].data = params[name].data.clone()
    version = None
    conn.send(("ready", os.getpid()))
    from .async_plan import batch_generator

    while True:
        try:
            job = conn.recv()
        except EOFError:  # the trainer is gone (killed): nothing left to sample for
            return
        if job is None:
            return
        try:
            t0 = time.perf_counter()
            if job.version != version:
                with torch.no_grad():
                    for name, t in job.tensors.items():
                        params[name].copy_(t)
                version = job.version
            conn.send(("synced", job.index, time.perf_counter() - t0))
            ro = sample(ctx, model, batch_generator(init["seed"], job.index, torch.device("cpu")), job.prompts)
            conn.send(("batch", job.index, ro))
        except Exception as e:  # noqa: BLE001 - reported to the trainer as this worker's fault
            conn.send(("error", job.index, f"{type(e).__name__}: {e}", traceback.format_exc(limit=3)))


class WorkerPool:
    """``n`` worker processes sampling whole batches; ``submit`` queues a job, ``result(index)`` waits
    (with deadlines) for that batch, dispatching queued jobs as workers free up."""

    def __init__(self, n: int, init: dict, *, timeout_s: float, on_fault: str, check: Callable[[Job, Any], str]):
        self.timeout_s, self.on_fault, self.check = timeout_s, on_fault, check
        # forkserver: one clean server process imports torch and grpokit's sampler once, and forks each worker
        # from it (a plain fork would copy the trainer's threads and locks; spawn re-imports everything)
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(["grpokit.rollout.async_process", type(init["model"]).__module__])
        self.stats = PoolStats()
        self.queue: list[Job] = []
        self.results: dict[int, Any] = {}
        self.sync_s = 0.0  # weight-sync seconds the workers reported since the last take
        self.workers: list[Worker] = []
        for k in range(n):
            parent, child = self.ctx.Pipe()
            proc = self.ctx.Process(target=_worker_main, args=(child, init), name=f"grpokit-rollout-{k}", daemon=True)
            proc.start()
            child.close()
            # starting imports torch in a fresh interpreter: its own, longer deadline
            self.workers.append(Worker(k, proc, parent, deadline=time.monotonic() + max(timeout_s, START_S)))
        try:
            while any(w.phase == "start" for w in self.workers):
                self._pump()
        except BaseException:  # a worker that cannot start: the others end with it, none is left behind
            self.close()
            raise

    def submit(self, job: Job) -> None:
        self.queue.append(job)
        self._dispatch()

    def result(self, index: int) -> tuple[Any, float]:
        """Batch ``index``'s rollout and the seconds waited on a straggler: while other workers sat idle
        with later batches done."""
        straggling = 0.0
        while index not in self.results:
            t0 = time.monotonic()
            later_done = any(j > index for j in self.results)
            self._pump()
            straggling += (time.monotonic() - t0) if later_done else 0.0
        return self.results.pop(index), straggling

    def _dispatch(self) -> None:
        for w in list(self.workers):
            if w.phase == "idle" and self.queue:
                w.job = self.queue.pop(0)
                w.phase, w.deadline = "sync", time.monotonic() + self.timeout_s
                try:
                    w.conn.send(w.job)
                except OSError as e:  # it died while idle: its end of the pipe is closed
                    self._fault(w, f"could not be sent batch {w.job.index} ({type(e).__name__}: it died while idle)")

    def _pump(self) -> None:
        """Handle what one wait brings: a message, a death, or a missed deadline."""
        self._dispatch()
        if not self.workers:
            raise RolloutWorkerError(
                "no rollout worker is left (rollout.async_workers): " + "; ".join(self.stats.dropped)
            )
        busy = [w for w in self.workers if w.phase != "idle"]
        if not busy:
            raise RolloutWorkerError("the rollout workers have no batch to sample (grpokit's own fault)")
        timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
        ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=timeout)
        for w in busy:
            if w.conn in ready:
                self._receive(w)
            elif w.proc.sentinel in ready:
                code = w.proc.exitcode
                how = f"was killed by {signal.Signals(-code).name}" if code and code < 0 else f"exited with code {code}"
                self._fault(w, f"{how} {self._doing(w)}")
            elif time.monotonic() >= w.deadline:
                limit = f"rollout.async_timeout_s={self.timeout_s:g} s" if w.phase != "start" else "its start deadline"
                self._fault(w, f"did not {self._task(w)} within {limit} (hung or stopped)")
        self._dispatch()

    def _receive(self, w: Worker) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError) as e:
            return self._fault(w, f"closed its pipe {self._doing(w)} ({type(e).__name__})")
        kind = msg[0] if isinstance(msg, tuple) and msg else None
        if kind == "ready" and w.phase == "start":
            w.phase = "idle"
        elif kind == "synced" and w.phase == "sync" and msg[1] == w.job.index:
            self.sync_s += float(msg[2])
            w.phase, w.deadline = "sample", time.monotonic() + self.timeout_s
        elif kind == "batch" and w.phase == "sample" and msg[1] == w.job.index:
            problem = self.check(w.job, msg[2])
            if problem:
                return self._fault(w, f"returned a malformed batch {w.job.index}: {problem}")
            self.results[w.job.index] = msg[2]
            w.job, w.phase = None, "idle"
        elif kind == "error":
            self._fault(w, f"failed on batch {msg[1]}: {msg[2]}")
        else:
            self._fault(w, f"sent an unexpected message {self._doing(w)}: {str(msg)[:80]!r}")

    def _task(self, w: Worker) -> str:
        if w.phase == "start":
            return f"start ({max(self.timeout_s, START_S):g} s)"
        if w.phase == "sync":
            return f"load the weights of version {w.job.version} for batch {w.job.index}"
        return f"finish sampling batch {w.job.index}"

    def _doing(self, w: Worker) -> str:
        return "while starting" if w.job is None else f"while working on batch {w.job.index}"

    def _fault(self, w: Worker, what: str) -> None:
        self.stats.faults += 1
        sentence = f"rollout worker {w.number} (pid {w.proc.pid}) {what}"
        self._end(w)
        self.workers.remove(w)
        if w.job is not None:
            self.queue.insert(0, w.job)  # another worker samples it: the result does not depend on which
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
