"""Tiny inline-SVG line charts for the run report: no plotting library, no scripts, no network.

A chart is a list of `Series` (label, points, color) drawn into one SVG element with "nice" axis
ticks (1, 2, 2.5 or 5 times a power of ten). Non-finite values break the line instead of bending it
to infinity. Long noisy series are drawn faintly with a moving average on top, the way dashboards
smooth curves; short or sparse series (evaluations) get a dot per point.

The SVG is inlined into the HTML; every label passes through `html.escape` because metric names can
contain user-chosen reward-function names.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")


@dataclass(frozen=True)
class Series:
    """One line: `points` are (step, value) pairs sorted by step; `color` a CSS color."""

    label: str
    points: Sequence[tuple[float, float]]
    color: str = PALETTE[0]
    dots_only: bool = False  # draw points without joining them (e.g. before/after evaluations)


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """About `target` round tick values covering [lo, hi]. Example: (0.03, 0.97) -> [0, 0.2, ..., 1.0]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:  # a flat series: open a small window around it (above it when it is 0: counts, fractions)
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = (lo, hi + pad) if lo == 0 else (lo - pad, hi + pad)
    raw = (hi - lo) / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step + 1e-9) * step
    ticks = []
    t = start
    while t < hi + step * 0.999:
        ticks.append(round(t, 12))
        t += step
        if len(ticks) > 4 * target:  # guards against float drift, never reached in practice
            break
    return ticks


def format_tick(value: float, step: float) -> str:
    """Tick label with just enough decimals for the tick spacing: (0.25, 0.05) -> '0.25', (2000, 500) -> '2k'."""
    if value == 0:
        return "0"
    if abs(value) >= 1e4 and step >= 1000:
        return f"{value / 1000:g}k"
    if abs(value) < 1e-3:
        return f"{value:.0e}"
    # As many decimals as the spacing itself needs: 0.25 -> 2, 0.2 -> 1, 2.5 -> 1, 500 -> 0.
    decimals = next((d for d in range(10) if abs(round(step, d) - step) < 1e-9 * max(1.0, abs(step))), 10)
    return f"{value:.{decimals}f}"


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Centred mean over `window` neighbours (window // 2 each side), skipping non-finite values.

    Centred rather than trailing so a sudden change shows where it happened instead of a few steps
    later. Non-finite inputs stay non-finite (the line keeps its gap). Example, window 3:
    [1, 3, nan, 5] -> [mean(1, 3), mean(1, 3), nan, mean(5)] = [2, 2, nan, 5].
    """
    half = window // 2
    # Prefix sums over the finite values make every window O(1): long runs stay fast.
    sums, counts = [0.0], [0]
    for v in values:
        ok = math.isfinite(v)
        sums.append(sums[-1] + (v if ok else 0.0))
        counts.append(counts[-1] + ok)
    out: list[float] = []
    for i, v in enumerate(values):
        if not math.isfinite(v):
            out.append(v)
            continue
        lo, hi = max(0, i - half), min(len(values), i + half + 1)
        out.append((sums[hi] - sums[lo]) / (counts[hi] - counts[lo]))
    return out


def line_chart(
    series: Sequence[Series],
    width: int = 560,
    height: int = 240,
    y_range: tuple[float, float] | None = None,
    include_zero: bool = False,
    smooth_over: int = 60,
    marks: Sequence[tuple[float, str]] = (),
    max_points: int = 600,
) -> str:
    """Render `series` as an inline <svg> string.

    Args:
        y_range: fixed (lo, hi) of the value axis (e.g. (0, 1) for fractions); None fits the data.
        include_zero: stretch a fitted value axis to include 0 (lengths, times, KL).
        smooth_over: series with more points than this are drawn faintly plus a moving average.
        marks: (step, note) pairs drawn as dashed vertical lines, e.g. the health warnings of a run.
        max_points: longer series are thinned to about this many drawn points (every k-th point).
    """
    left, right, top, bottom = 58, 14, 10, 30
    pw, ph = width - left - right, height - top - bottom
    finite = [(x, y) for s in series for x, y in s.points if math.isfinite(x) and math.isfinite(y)]
    if not finite:
        return f'<svg class="chart" viewBox="0 0 {width} {height}" role="img"><text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="muted">no finite values</text></svg>'
    xs = [p[0] for p in finite]
    ys = [p[1] for p in finite]
    x_ticks = nice_ticks(min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1, 6)
    if x_ticks[-1] - x_ticks[0] > 2:
        x_ticks = [t for t in x_ticks if float(t).is_integer()] or x_ticks
    if y_range is not None:
        lo, hi = y_range
        lo, hi = min(lo, min(ys)), max(hi, max(ys))
    else:
        lo, hi = min(ys), max(ys)
        if include_zero:
            lo, hi = min(lo, 0.0), max(hi, 0.0)
    y_ticks = nice_ticks(lo, hi, 5)
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / ((y1 - y0) or 1) * ph

    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" preserveAspectRatio="xMidYMid meet">']
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 1.0
    for t in y_ticks:
        parts.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}"/>')
        parts.append(f'<text class="tick" x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{html.escape(format_tick(t, y_step))}</text>')
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    for t in x_ticks:
        parts.append(f'<line class="grid" x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top}" y2="{top + ph}"/>')
        parts.append(f'<text class="tick" x="{sx(t):.1f}" y="{top + ph + 18}" text-anchor="middle">{html.escape(format_tick(t, x_step))}</text>')
    parts.append(f'<rect class="frame" x="{left}" y="{top}" width="{pw}" height="{ph}"/>')
    for x, note in marks:
        if math.isfinite(x) and x0 <= x <= x1:
            parts.append(f'<line class="mark" x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{top}" y2="{top + ph}"><title>{html.escape(note)}</title></line>')
    for s in series:
        pts = [(x, y) for x, y in s.points if math.isfinite(x)]
        if not pts:
            continue
        label, color = html.escape(s.label), html.escape(s.color)
        noisy = len(pts) > smooth_over
        # Thin very long runs to about `max_points` drawn points per line: a 20k-step run stays a small
        # file, and the screen has fewer pixels than that anyway. The average uses every point.
        stride = max(1, math.ceil(len(pts) / max_points))
        if s.dots_only:
            for x, y in pts:
                if math.isfinite(y):
                    parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="5.5" fill="none" stroke="{color}" stroke-width="2.5"><title>{label} step {x:g}: {y:.4g}</title></circle>')
            continue
        parts.append(_path([(sx(x), sy(y)) if math.isfinite(y) else None for x, y in pts[::stride]], color, 0.3 if noisy else 1.0, label))
        if noisy:
            avg = moving_average([y for _, y in pts], max(5, len(pts) // 15))
            thinned = list(zip(pts, avg))[::stride]
            parts.append(_path([(sx(x), sy(y)) if math.isfinite(y) else None for (x, _), y in thinned], color, 1.0, label + " (moving average)"))
        if len(pts) <= 40:
            for x, y in pts:
                if math.isfinite(y):
                    parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"><title>{label} step {x:g}: {y:.4g}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def _path(points: Sequence[tuple[float, float] | None], color: str, opacity: float, label: str) -> str:
    """A polyline path; `None` entries (non-finite values) lift the pen."""
    d: list[str] = []
    pen_down = False
    for p in points:
        if p is None:
            pen_down = False
            continue
        d.append(f"{'L' if pen_down else 'M'}{p[0]:.1f},{p[1]:.1f}")
        pen_down = True
    if not d:
        return ""
    return f'<path d="{" ".join(d)}" fill="none" stroke="{color}" stroke-width="2" stroke-opacity="{opacity}" stroke-linejoin="round"><title>{label}</title></path>'
