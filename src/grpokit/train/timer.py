"""Seconds (and, on CUDA, peak memory) per named phase of one step."""

from __future__ import annotations

import time

from .memory import PhasePeaks


class Timer:
    """Seconds per named phase of one step (a phase may be entered several times), and with a
    memory provider (memory.py, CUDA) the peak GPU memory per phase."""

    def __init__(self, memory=None):
        self.spans: dict[str, float] = {}
        self.t0 = time.perf_counter()
        self.memory = PhasePeaks(memory) if memory is not None else None

    def __call__(self, name: str):
        timer = self

        class _Span:
            def __enter__(self):
                self.start = time.perf_counter()
                timer.memory.enter(name) if timer.memory is not None else None

            def __exit__(self, *exc):
                timer.spans[name] = timer.spans.get(name, 0.0) + time.perf_counter() - self.start
                timer.memory.exit(name) if timer.memory is not None else None

        return _Span()

    def total(self) -> float:
        return time.perf_counter() - self.t0

    def metrics(self) -> dict[str, float]:
        return {
            **{f"time/{k}": v for k, v in self.spans.items()},
            "time/step": self.total(),
            **(self.memory.metrics() if self.memory is not None else {}),
        }
