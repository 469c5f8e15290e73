"""Seconds (and, on CUDA, peak memory) per named phase of one step."""

from __future__ import annotations

import contextlib
import time

from .memory import PhasePeaks


class Timer:
    """Seconds per named phase of one step (a phase may be entered several times), and with a
    memory provider (memory.py, CUDA) the peak GPU memory per phase."""

    def __init__(self, memory=None):
        self.spans: dict[str, float] = {}
        self.t0 = time.perf_counter()
        self.memory = PhasePeaks(memory) if memory is not None else None

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        self.memory.enter(name) if self.memory is not None else None
        try:
            yield
        finally:
            self.spans[name] = self.spans.get(name, 0.0) + time.perf_counter() - start
            self.memory.exit(name) if self.memory is not None else None

    def total(self) -> float:
        return time.perf_counter() - self.t0

    def metrics(self) -> dict[str, float]:
        return {
            **{f"time/{k}": v for k, v in self.spans.items()},
            "time/step": self.total(),
            **(self.memory.metrics() if self.memory is not None else {}),
        }
