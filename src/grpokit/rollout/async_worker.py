"""A rollout worker process's side of the pool (rollout/async_workers.py): load the init record, then answer jobs.

The worker samples on the init record's device (``rollout.async_worker_device``, a remote worker's ``--device``):
its policy moves there at its start unless it is there already (the trainer's own tensors, shared), and each
version's tensors, wherever they arrive, are copied into its parameters there.

A job names a batch, the version it starts with and the shared-memory handles of the versions it needs that
the trainer has already published. With partial rollouts (``rollout.async_partial_tokens``) segment m of batch
j is drawn by version ``min(j - s + m, j)`` (rollout/partial.py), which may not be published yet when the job
starts: the trainer then pushes that version's handles (``("version", v, tensors)``) when its update ends, and
the worker, at the segment boundary, waits for them, as the sampler thread waits for the snapshot. Before it
blocks it says so (``("waiting", j, v)``), so that the trainer suspends its deadline (the wait is the
trainer's, not the worker's) and, if the trainer needs another batch first, can take this one back
(``("abandon", j)``; the batch is redone from its start later, equal by construction).

Messages to the trainer: ``ready``; per segment ``synced`` (its version is loaded); ``waiting``; ``batch``;
``abandoned``; ``error``.
"""

from __future__ import annotations

import os
import time
import traceback

import torch

from .partial import segment_version


class _Abandoned(Exception):
    """The trainer took the batch back while it waited for a version."""


class _Stop(Exception):
    """The trainer told the worker to stop (None) while it waited for a version."""


class _Weights:
    """A worker's policy and the versions its current job may use (the job's and those pushed since)."""

    def __init__(self, conn, model: torch.nn.Module, trainable: list[str], receive=None, release=None, own=False):
        """``receive(version)``: a version's tensors when a message carries None for them (a remote worker's
        weights come through its gloo pair: rollout/async_remote_worker.py); ``release(version)``: they are
        no longer read (copied into the policy, or their batch is over), their buffer free for the next;
        ``own``: the model's tensors are already this worker's (moved to its device), none shared."""
        self.conn, self.model, self.receive = conn, model, receive
        self.release = release or (lambda version: None)
        self.params = dict(model.named_parameters())
        with torch.no_grad():  # the trainable tensors become this worker's own; the frozen ones stay shared
            for name in [] if own else trainable:
                self.params[name].data = self.params[name].data.clone()
        self.loaded: int | None = None
        self.job = None
        self.known: dict[int, dict] = {}
        self.waited = self.received = self.unreported = 0.0  # this batch's seconds not sampling

    def start(self, job) -> None:
        for v in self.known:  # the last batch's versions it never loaded (given back, or pushed late)
            self.release(v)
        self.job, self.waited, self.received, self.unreported = job, 0.0, 0.0, 0.0
        self.known = {v: self._tensors(v, t) for v, t in {job.version: job.tensors, **job.later}.items()}

    def _tensors(self, version: int, tensors):
        """The message's tensors, or (None) the version received through the pair, its seconds counted as weight
        sync (reported with the next ``synced``), not sampling."""
        if tensors is not None:
            return tensors
        t0 = time.perf_counter()
        tensors = self.receive(version)
        self.received += time.perf_counter() - t0
        self.unreported += time.perf_counter() - t0
        return tensors

    def version_model(self, segment: int) -> tuple[torch.nn.Module, int]:
        """Segment ``segment``'s policy and version, waiting for the trainer to push a version not yet
        published; tells the trainer each segment it starts (``synced``: its deadline restarts)."""
        j = self.job.index
        v = segment_version(j, segment, self.job.version)
        while self.conn.poll():  # versions pushed while the last segment decoded
            self._take(self.conn.recv())
        if v not in self.known:
            self.conn.send(("waiting", j, v))
            t0, r0 = time.perf_counter(), self.received
            while v not in self.known:
                self._take(self.conn.recv())
            self.waited += time.perf_counter() - t0 - (self.received - r0)  # not sampling, nor its receive
        t0 = time.perf_counter()
        if v != self.loaded:
            if self.known[v] is None:
                raise RuntimeError(f"version {v} was released before it was loaded again (grpokit's own fault)")
            with torch.no_grad():
                for name, t in self.known[v].items():
                    self.params[name].copy_(t)
            self.loaded = v
            self.release(v)  # a batch's segments never go back to an older version: not read again
            self.known[v] = None
        self.conn.send(("synced", j, segment, v, time.perf_counter() - t0 + self.unreported))
        self.unreported = 0.0
        return self.model, v

    def _take(self, msg) -> None:
        if msg is None:
            raise _Stop
        if msg[0] == "version":
            self.known[msg[1]] = self._tensors(msg[1], msg[2])
        elif msg[0] == "abandon" and msg[1] == self.job.index:
            raise _Abandoned


def _policy(init: dict) -> tuple[torch.nn.Module, torch.device, bool]:
    """The init record's policy, made ready on the worker's device: ``(model, device, moved)``; ``moved`` when it
    moved there (each tensor a copy of the worker's own), not when it was there already (the trainer's shared
    tensors, or a remote worker's CPU copy on a CPU). Patched as the trainer's is: oneDNN linears on a CPU,
    liger-kernel's layers (``init["kernels"]``, set when the trainer's had them) on a card."""
    torch.set_num_threads(init["threads"])
    device, model = torch.device(init["device"]), init["model"]
    if device.type == "cuda":
        if device.index is not None:  # "cuda" alone: this process's current card (set_device wants an index)
            torch.cuda.set_device(device)
        device = torch.device("cuda", torch.cuda.current_device())
        if init["deterministic"]:  # cuBLAS refuses deterministic mode without it
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(init["deterministic"])
    moved = not all(t.device == device for t in [*model.parameters(), *model.buffers()])
    if moved:
        model.to(device)
    if init["onednn"] and device.type == "cpu":  # the trainer's linears run through oneDNN: the same kernels
        from grpokit.nn.kernels import use_onednn_linears

        use_onednn_linears(model)
    if init["kernels"] is not None and device.type == "cuda":
        init["kernels"](model, device)
    return model, device, moved


def worker_main(conn, init: dict | None = None, receive=None, release=None) -> bool:
    """A worker's life: receive the init record (unless given), then answer jobs until told to stop (None).
    True when told to stop, False when the trainer went away (its end closed)."""
    if init is None:
        try:  # through the pipe, not the process's arguments: a forkserver child takes at most ~250 descriptors
            init = conn.recv()  # there, one per shared tensor; the pipe hands each over on its own
        except EOFError:
            return False
    model, device, moved = _policy(init)
    sample, ctx = init["sample"], init["context"]
    weights = _Weights(conn, model, init["trainable"], receive, release, own=moved)
    conn.send(("ready", os.getpid(), torch.get_num_threads()))
    from .async_plan import batch_generator

    while True:
        job = None
        try:
            job = conn.recv()
            if job is None:
                return True
            if isinstance(job, tuple):  # a version pushed for a batch already finished: received, not used
                if receive is not None and job[0] == "version" and job[2] is None:
                    receive(job[1])  # its bytes come through the pair all the same
                    weights.release(job[1])
                continue
            t0 = time.perf_counter()
            weights.start(job)
            generator = batch_generator(init["seed"], job.index, device)
            if init["partial"]:  # the sample function asks for each segment's version itself
                ro = sample(ctx, weights.version_model, generator, job.prompts)
            else:
                ro = sample(ctx, weights.version_model(0)[0], generator, job.prompts)
            answer = ("batch", job.index, ro, time.perf_counter() - t0 - weights.waited - weights.received)
        except _Stop:
            return True
        except (EOFError, OSError):  # the trainer is gone (killed): nothing left to sample for
            return False
        except _Abandoned:
            answer = ("abandoned", job.index)
        except Exception as e:  # noqa: BLE001 - reported to the trainer as this worker's fault
            index = getattr(job, "index", None)
            answer = ("error", index, f"{type(e).__name__}: {e}", traceback.format_exc(limit=3))
        try:
            conn.send(answer)
        except OSError:  # gone while this worker sampled
            return False
