"""A reward function's values read and summarised: one returned value checked (a number that fits in float32,
or None), and one function's mean and std over the completions it scored.

The runner (rewards/runner.py) checks every value with ``check_value``; ``value_stats`` is its metrics of one
function, and the same statistic over the rows a step keeps (rollout/collect.py) and trains
(train/step_metrics.py), so every ``rewards/<name>/mean`` leaves out the same completions."""

from __future__ import annotations

import math
from typing import Any

import torch


class NonFiniteReward(ValueError):
    """A reward function returned NaN, an infinity or a number beyond float32: counted as a failure."""


_FLOAT32_MAX = 3.4028234663852886e38


def check_value(value: Any, convention: str = "grpokit") -> float | None:
    """None stays None; bools and real numbers become float; anything else (NaN, inf, 1e300 too) is an error,
    but under ``convention="trl"`` a NaN is None (TRL fills None with NaN, then skips every NaN).
    Example: check_value(True) -> 1.0; check_value(float("nan"), "trl") -> None; check_value(1e300) raises."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or isinstance(value, (int, float)) or hasattr(value, "__float__"):
        try:
            out = float(value)
        except (OverflowError, TypeError, ValueError) as exc:  # a huge int, a __float__ that raises
            raise NonFiniteReward(f"reward cannot be read as a float ({type(exc).__name__})") from None
        if math.isnan(out) and convention == "trl":
            return None
        if not math.isfinite(out):
            raise NonFiniteReward(f"reward is {out}")
        if abs(out) > _FLOAT32_MAX:  # rewards are float32 tensors: 1e300 would be an overflow error there
            raise NonFiniteReward(f"reward {out:g} does not fit in float32")
        return out
    raise TypeError(f"reward must be a number or None, got {type(value).__name__}")


def value_stats(values_N: torch.Tensor, failed_N: torch.Tensor | None, name: str) -> dict[str, float]:
    """``rewards/<name>/mean`` and ``/std`` (population) of one function's values over the completions it
    scored: neither failed (``failed_N``; None: none did) nor not applicable (NaN); NaN when it scored none.
    The runner's metrics, and rollout/collect.py's over the rows a step keeps (dynamic sampling, GFPO)."""
    ok = ~values_N.isnan() if failed_N is None else ~failed_N & ~values_N.isnan()
    scored = values_N[ok]
    return {
        f"rewards/{name}/mean": scored.mean().item() if len(scored) else float("nan"),
        f"rewards/{name}/std": scored.std(unbiased=False).item() if len(scored) else float("nan"),
    }
