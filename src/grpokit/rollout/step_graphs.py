"""CUDA graphs of the static decode step (rollout/static.py): one graph per (rows, window) seen in a rollout,
captured on first use and replayed after, dropped with the decoder (or when finished rows leave it).

A decode step of a 0.5B model is a few hundred small kernels, and launching them one by one from Python
costs more than running them. A graph needs fixed shapes and addresses, so the graphed step attends to a
fixed-width window of the cache, the next multiple of ``GRAPH_COLUMNS`` columns, and takes its inputs
(tokens, positions, the column it writes) in tensors of its own.

Captures run in ``thread_local`` mode on whichever thread decodes: another thread's CUDA calls during a
capture (the update beside rollout/async_.py's sampler thread, or that sampler beside a refill captured
on the trainer's thread) are its own business, where the default ``global`` mode would break the capture.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch

from grpokit.nn.models import WeakBound

GRAPH_COLUMNS = 128  # a graphed step attends to a window of the cache this many columns wider at a time

CAPTURE_GUARD = threading.RLock()  # re-entrant: a compute_loss override may sample (and capture) itself
"""Held by every capture, and by the trainer around each micro-batch's forward and backward (train/update.py).
torch registers the device's default CUDA generator with each capture, and a draw from it on another thread while
the capture runs (dropout, LoRA's dropout, NEFTune's noise in the update beside the asynchronous sampler's capture)
fails with "Offset increment outside graph capture encountered unexpectedly" (an H200, 2026-11-30). A capture is one
decode step; the sampler waits at most one micro-batch's launches for it."""


class StepGraphs:
    """The graphs of one decoder's step ``forward(tok, pos, col, width) -> logits`` (``col`` a (1,) device
    tensor holding the column it writes, ``width`` the window it attends to)."""

    def __init__(self, forward: Callable[..., torch.Tensor]):
        # ``forward``, the decoder's own method, held weakly: decoder -> graphs -> method -> decoder would be
        # a reference cycle, and the decoder's KV cache would outlive its rollout until Python's cycle collector
        # ran (3.8 GB of the 0.5B workload held into the update on alternate steps, an H200 2026-11-30)
        self.forward = WeakBound(forward.__func__, forward.__self__)
        self.graphs: dict[tuple[int, int], tuple] = {}  # (rows, window) -> (graph, tok, pos, col, logits)
        self.pool = None  # one CUDA memory pool shared by the graphs (they never run at the same time)

    def reset(self) -> None:
        """Drop every graph: they were captured on tensors the decoder no longer uses (a released pool cannot
        take new graphs, so a new one comes with the next capture)."""
        self.graphs, self.pool = {}, None

    def replay(self, tok_n: torch.Tensor, pos_n: torch.Tensor, t: int, columns: int) -> torch.Tensor:
        """The step writing column ``t`` of a cache of ``columns``, as the graph for (rows, window), captured
        on first use; inputs are copied into the graph's own tensors. The returned logits are overwritten by
        the next replay."""
        n = tok_n.shape[0]
        width = min(columns, -(-(t + 1) // GRAPH_COLUMNS) * GRAPH_COLUMNS)
        entry = self.graphs.get((n, width))
        if entry is None:
            entry = self.capture(tok_n, pos_n, t, width)
            self.graphs[(n, width)] = entry
        graph, tok, pos, col, logits = entry
        tok.copy_(tok_n)
        pos.copy_(pos_n)
        col.fill_(t)
        graph.replay()
        return logits

    def capture(self, tok_n: torch.Tensor, pos_n: torch.Tensor, t: int, width: int) -> tuple:
        """Capture the step for (rows, window).

        On the default stream (the trainer's thread) the step is warmed up on a side stream and captured
        by ``torch.cuda.graph``, which first synchronises the device and empties torch's cache. On any other
        stream (rollout/async_.py's sampler thread, beside the update) the step is warmed up and captured
        on that stream itself, with no device-wide synchronisation and no emptied cache: those would wait
        for the update's queued kernels and hand its cached memory back to CUDA at every capture."""
        tok, pos = tok_n.clone(), pos_n.clone()
        col = torch.full((1,), t, dtype=torch.long, device=tok.device)
        graph = torch.cuda.CUDAGraph()
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        stream = torch.cuda.current_stream()
        if stream == torch.cuda.default_stream(stream.device):
            side = warmup_stream(tok.device)
            side.wait_stream(stream)
            with torch.cuda.stream(side):  # warm-up off the capture (lazy tables, cuBLAS workspaces); same values
                self.forward(tok, pos, col, width)
            stream.wait_stream(side)
            with CAPTURE_GUARD, torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                logits = self.forward(tok, pos, col, width)
            return graph, tok, pos, col, logits
        self.forward(tok, pos, col, width)  # warm-up on the stream the capture records
        with CAPTURE_GUARD:
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                logits = self.forward(tok, pos, col, width)
            finally:
                graph.capture_end()
        return graph, tok, pos, col, logits


_WARMUP_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def warmup_stream(device: torch.device) -> "torch.cuda.Stream":
    """One side stream per device for the warm-up run before each capture. torch keeps a cuBLAS
    workspace (32 MiB on Hopper by default) for every stream cuBLAS has run on, for the life of the
    process; a new stream for each of a rollout's captures (five windows of 128 columns at 512
    tokens) would hold another ~160 MiB every step until torch's pool of 32 streams came round again.
    That is the likely cause of the 0.16 GB a step that bench/RESULTS.md saw on an H100 (5 x 32 MiB;
    to be confirmed on a card: tests/project/test_gpu.py::test_gpu_memory_does_not_grow_across_steps)."""
    device = torch.device(device)
    if device not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[device] = torch.cuda.Stream(device)
    return _WARMUP_STREAMS[device]
