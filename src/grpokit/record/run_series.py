"""A finished run's metrics as series the doctor's checks read (record/doctor.py).

"early" is the mean of a metric's first ``window`` values, "recent" of its last ``window``, with the
window shrunk to a third of the run for short runs; trend checks need at least 6 values. Non-finite
and non-numeric values are skipped.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from grpokit.config.health import HealthConfig

from .report_data import Run


def values(run: Run, key: str) -> list[tuple[int, float]]:
    return [
        (int(r["step"]), float(r[key]))
        for r in run.metrics
        if isinstance(r.get(key), (int, float))
        and not isinstance(r.get(key), bool)
        and isinstance(r.get("step"), (int, float))
        and math.isfinite(r[key])
    ]


def window(n: int, hc: HealthConfig) -> int:
    return max(2, min(hc.window, n // 3))


def trend(run: Run, key: str, hc: HealthConfig) -> tuple[float, float, str] | None:
    """(early mean, recent mean, "steps a-b vs c-d") of a metric, or None with fewer than 6 values."""
    pts = values(run, key)
    if len(pts) < 6:
        return None
    w = window(len(pts), hc)
    early, recent = pts[:w], pts[-w:]
    span = f"steps {early[0][0]}-{early[-1][0]} vs {recent[0][0]}-{recent[-1][0]}"
    return statistics.fmean(v for _, v in early), statistics.fmean(v for _, v in recent), span


def recent(run: Run, key: str, hc: HealthConfig) -> tuple[float, str] | None:
    pts = values(run, key)
    if len(pts) < min(hc.warmup_steps, 3) or not pts:
        return None
    last = pts[-window(len(pts), hc) :]
    return statistics.fmean(v for _, v in last), f"steps {last[0][0]}-{last[-1][0]}"


def heldout_gain(run: Run) -> tuple[float, str] | None:
    """Held-out accuracy change over the run: eval/accuracy's first and last values, else summary.json."""
    pts = values(run, "eval/accuracy")
    if len(pts) >= 2:
        return pts[-1][1] - pts[0][
            1
        ], f"eval/accuracy {pts[0][1]:.3g} (step {pts[0][0]}) -> {pts[-1][1]:.3g} (step {pts[-1][0]})"
    acc = [
        run.summary.get(k, {}).get("accuracy") if isinstance(run.summary.get(k), dict) else None
        for k in ("eval_before", "eval_after")
    ]
    if all(isinstance(a, (int, float)) for a in acc):
        return acc[1] - acc[0], f"held-out accuracy {acc[0]:.3g} before -> {acc[1]:.3g} after training"
    return None


def config_value(run: Run, dotted: str, default: Any = "?") -> Any:
    node: Any = run.config
    for part in dotted.split("."):
        node = node.get(part, default) if isinstance(node, dict) else default
    return node


def top_sample(run: Run) -> str:
    """The best-rewarded completion of the last sampled step, to read for a shortcut ("" without samples)."""
    rows = [
        r for r in run.samples if isinstance(r.get("completions"), list) and isinstance(r.get("step"), (int, float))
    ]
    if not rows:
        return ""
    last = max(r["step"] for r in rows)
    comps = [
        c
        for r in rows
        if r["step"] == last
        for c in r["completions"]
        if isinstance(c, dict) and isinstance(c.get("reward"), (int, float)) and math.isfinite(c["reward"])
    ]
    if not comps:
        return ""
    best = max(comps, key=lambda c: c["reward"])
    text = " ".join(str(best.get("text", "")).split())
    return (
        f"; best sample of step {int(last)} (reward {best['reward']:.3g}): "
        f'"{text[:120]}{"..." if len(text) > 120 else ""}"'
    )


def total(run: Run, key: str) -> float:
    return sum(v for _, v in values(run, key))
