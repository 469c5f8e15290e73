"""GPU memory: readings per phase of a step, and the automatic memory plan.

Metrics (CUDA only; absent on CPU): ``gpu/memory_allocated_gb`` and ``gpu/memory_reserved_gb`` at
the end of the step, ``gpu/memory_peak_gb`` over the step and ``gpu/<phase>/memory_peak_gb`` for
each timed phase (rollout, rewards, update ...). The reading goes through a small provider (three
numbers and a peak reset), so tests run the bookkeeping on CPU with a fake one.

The plan, chosen once at start (``train.memory_plan="auto"``) and said in one log line:

* activation checkpointing, when the activations one micro-batch keeps for backward (estimated from
  the model's shape, ``update.token_budget``) exceed ``train.activation_memory_mb`` at the longest
  possible rows: recomputing each layer in the backward pass keeps one hidden state per layer and
  token instead of ~(10 x hidden + 4 x intermediate) values, for about a third more update FLOPs;
* the reference model (beta > 0, full fine-tuning) kept on CPU between its passes, when the
  training state (weights, gradients and two Adam moments of the trained part) plus the reference copy would take more
  than half of the GPU: it then costs one host-device copy of the weights per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

GB = 2**30


@dataclass
class MemoryProvider:
    """``read() -> (allocated, reserved, peak allocated)`` bytes and ``reset_peak()``."""

    read: Callable[[], tuple[int, int, int]]
    reset_peak: Callable[[], None]


def cuda_provider(device: torch.device) -> MemoryProvider | None:
    """The CUDA caching allocator's numbers for ``device``; None off CUDA (no metrics)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return MemoryProvider(
        lambda: (
            torch.cuda.memory_allocated(device),
            torch.cuda.memory_reserved(device),
            torch.cuda.max_memory_allocated(device),
        ),
        lambda: _reset_peak(device),
    )


_PEAKS_BEFORE_RESET: dict[str, int] = {}  # device -> the largest peak read before grpokit reset it


def _reset_peak(device: torch.device) -> None:
    key = str(device)
    _PEAKS_BEFORE_RESET[key] = max(_PEAKS_BEFORE_RESET.get(key, 0), torch.cuda.max_memory_allocated(device))
    torch.cuda.reset_peak_memory_stats(device)


def peak_allocated_bytes(device: torch.device | str = "cuda") -> int:
    """The process's peak allocated memory on ``device`` since it started. grpokit resets the
    allocator's peak at every phase boundary (for ``gpu/<phase>/memory_peak_gb``), so after a step
    ``torch.cuda.max_memory_allocated()`` covers only the last phase; this adds what each reset
    cleared."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0
    return max(torch.cuda.max_memory_allocated(device), _PEAKS_BEFORE_RESET.get(str(device), 0))


class PhasePeaks:
    """Peak allocated memory per named phase; phases may nest (an inner phase's peak also counts
    for the outer one) and repeat (the max is kept)."""

    def __init__(self, provider: MemoryProvider):
        self.provider, self.peaks, self.open = provider, {}, []
        self.step_peak = 0
        provider.reset_peak()

    def _fold(self) -> None:  # the peak since the last reset counts for every open phase
        peak = self.provider.read()[2]
        self.step_peak = max(self.step_peak, peak)
        for name in self.open:
            self.peaks[name] = max(self.peaks.get(name, 0), peak)
        self.provider.reset_peak()

    def enter(self, name: str) -> None:
        self._fold()
        self.open.append(name)

    def exit(self, name: str) -> None:
        self._fold()
        self.open.remove(name)

    def metrics(self) -> dict[str, float]:
        self._fold()
        allocated, reserved, _ = self.provider.read()
        return {
            "gpu/memory_allocated_gb": allocated / GB,
            "gpu/memory_reserved_gb": reserved / GB,
            "gpu/memory_peak_gb": self.step_peak / GB,
            **{f"gpu/{name}/memory_peak_gb": v / GB for name, v in self.peaks.items()},
        }


@dataclass
class MemoryPlan:
    checkpointing: bool
    offload_reference: bool
    reasons: list[str]

    def line(self) -> str:
        """The one log line: what was chosen and why."""
        return "grpokit: memory: " + ("; ".join(self.reasons) if self.reasons else "nothing to change")


def plan_memory(
    *,
    per_token_bytes: int,
    checkpointed_token_bytes: int,
    budget_mb: int,
    rows: int,
    max_len: int,
    param_bytes: int,
    trainable_bytes: int,
    reference_copy: bool,
    device_bytes: int,
) -> MemoryPlan:
    """Decide activation checkpointing and reference offload (module docstring says when).

    Example: 512 rows x 640 tokens at 1.36 MB a token (Qwen2.5-0.5B in bf16) need 446 GB against a
    20 GB budget -> checkpointing, after which a token keeps 43 KB + one layer's 1.36 MB.
    """
    reasons, need = [], rows * max_len * per_token_bytes
    checkpointing = bool(budget_mb) and per_token_bytes > 0 and need > budget_mb * 2**20
    if checkpointing:
        reasons.append(
            f"activation checkpointing on ({rows} rows x {max_len} tokens keep ~{need / GB:.1f} GB of "
            f"activations, over the {budget_mb / 1024:.1f} GB budget train.activation_memory_mb; "
            f"checkpointed ~{rows * max_len * checkpointed_token_bytes / GB:.1f} GB)"
        )
    # weights + the trained part's gradient and two Adam moments (torch keeps them in the weights' dtype)
    state = param_bytes + 3 * trainable_bytes
    offload = reference_copy and device_bytes > 0 and state + param_bytes > device_bytes // 2
    if offload:
        reasons.append(
            f"reference model on CPU between its passes (training state ~{state / GB:.1f} GB + reference "
            f"{param_bytes / GB:.1f} GB > half of the GPU's {device_bytes / GB:.0f} GB)"
        )
    return MemoryPlan(checkpointing, offload, reasons)
