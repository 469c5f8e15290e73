"""Timing, the one way bench/ times a call: wall time with the device synchronised before and after (a
CUDA call returns before its kernels finish), and the figures bench/RESULTS.md quotes for a list of
times (median, range, p90). torch is imported only to synchronise a CUDA device, so a script that must
set Triton's interpreter first (vocab_kernels.py --tiny) can import this module early."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def sync(device: str) -> None:
    """Wait for the device's queued work (``device``: "cpu", "cuda", "cuda:1" ...); nothing on CPU."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def seconds(fn: Callable[[], Any], device: str = "cpu") -> tuple[float, Any]:
    """(seconds ``fn()`` took, what it returned), the device synchronised around the call."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def median_ms(fn: Callable[[], Any], warmup: int, reps: int, device: str = "cpu") -> float:
    """Median milliseconds of ``reps`` calls of ``fn()`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    return statistics.median(seconds(fn, device)[0] * 1e3 for _ in range(reps))


def spread(values: list[float]) -> dict[str, float]:
    """Median, min, max and p90 (the value below which 90% of the sorted list lies) of ``values``."""
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "p90": ordered[int(0.9 * (len(ordered) - 1))],
        "n": len(ordered),
    }
