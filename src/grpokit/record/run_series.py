"""A finished run's metrics as series the doctor's checks read (record/doctor.py).

"early" is the mean of a metric's first ``window`` values, "recent" of its last ``window``, with the
window shrunk to a third of the run for short runs; trend checks need at least 6 values. Non-finite
and non-numeric values are skipped here; the doctor's non-finite checks (nonfinite_checks.py) name
the non-finite values of every metric the checks read (COVERAGE, and health.nonfinite_keys).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from grpokit.config.health import HealthConfig

from .health import HealthMonitor
from .health_checks import Reading, reward_level, solved_from_start, unsolved_share
from .report_data import Run

# What each family of the doctor's checks reads (doctor.py): a family none of whose metrics the run has was not
# checked, and the doctor says so (a TRL run without held-out evaluation, a run that logs no entropy); a metric
# read here whose values are NaN or inf is named (nonfinite_checks.py: `values` skips them).
COVERAGE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the reward (constant reward, plateau, hacking)", ("reward", "completions/reward_max")),
    ("held-out accuracy (reward hacking against it, drops)", ("@heldout",)),
    ("groups without signal", ("frac_reward_zero_std", "reward_std")),
    ("entropy collapse", ("entropy",)),
    ("completion length (growth, truncation, same-length groups)", ("completions/mean_length",)),
    ("KL to the reference", ("kl",)),
    ("clipping (runaway, asymmetry, a narrow clip range)", ("clip_ratio/region_mean", "clip_ratio/low_mean")),
    ("gradients (spikes, zero-gradient steps)", ("grad_norm", "grad_norm/max")),
    ("reward-function failures", ("rewards/failed_fraction",)),
)


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
    return trend_of(values(run, key), hc)


def trend_of(pts: list[tuple[int, float]], hc: HealthConfig) -> tuple[float, float, str] | None:
    """`trend` of a series of (step, value), oldest first."""
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


def live_alarm(run: Run, name: str, keys: tuple[str, ...], hc: HealthConfig) -> Reading | None:
    """The live monitor `name` (health_checks.MONITORS, what `grpokit train` warns with) read on the whole
    run: the run's rows replayed through the live HealthMonitor itself (its derived reward level and
    solved-group shares included), with the doctor's window (`window`, on the count of `keys[0]`: shrunk
    to a third of a short run) and a warm-up of at most 3 values (as `recent`), so that the doctor and
    the live alarm decide with one rule. None while the monitor lacks data."""
    n = len(values(run, keys[0]))
    cfg = dataclasses.replace(hc, window=window(n, hc), warmup_steps=min(hc.warmup_steps, 3), enabled=True)
    monitor = HealthMonitor(cfg, run_config=run.config if isinstance(run.config, dict) else {})
    for r in run.metrics:
        if isinstance(r.get("step"), (int, float)) and not isinstance(r.get("step"), bool):
            monitor.observe({k: v for k, v in r.items() if k != "step" and not k.startswith("health/")}, int(r["step"]))
    return monitor.reading(name)


def heldout_series(run: Run) -> list[tuple[int, float]]:
    """Held-out accuracy over the run, oldest first: summary.json's before-training score at step 0,
    every periodic `eval/accuracy`, then summary.json's after-training score at the last step (each
    step once: a logged value wins over the summary's at the same step). The before-training score
    is the baseline whenever it exists, also when `train.eval_every` logged periodic evaluations."""
    pts = dict(values(run, "eval/accuracy"))
    for key, step in (("eval_before", 0), ("eval_after", last_step(run))):
        acc = run.summary.get(key, {}).get("accuracy") if isinstance(run.summary.get(key), dict) else None
        if isinstance(acc, (int, float)) and not isinstance(acc, bool) and math.isfinite(acc) and step not in pts:
            pts[step] = float(acc)
    return sorted(pts.items())


def last_step(run: Run) -> int:
    steps = run.summary.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool):
        return steps
    return max((int(r["step"]) for r in run.metrics if isinstance(r.get("step"), (int, float))), default=0)


def heldout_gain(run: Run) -> tuple[float, str] | None:
    """Held-out accuracy change over the run, from its baseline (the before-training score where it
    exists) to its latest evaluation (`heldout_series`), with the evidence; None with fewer than 2."""
    pts = heldout_series(run)
    if len(pts) < 2:
        return None
    (s0, a0), (s1, a1) = pts[0], pts[-1]
    return a1 - a0, f"held-out accuracy {a0:.3g} (step {s0}) -> {a1:.3g} (step {s1})"


def reward_span(run: Run) -> tuple[float, float] | None:
    """(lowest, highest) completion reward seen in the run (`completions/reward_min` / `_max`, else the
    step means `reward`), or None without either."""
    lows = [v for _, v in values(run, "completions/reward_min")] or [v for _, v in values(run, "reward")]
    highs = [v for _, v in values(run, "completions/reward_max")] or [v for _, v in values(run, "reward")]
    return (min(lows), max(highs)) if lows and highs else None


def unsolved_zero_std(run: Run, hc: HealthConfig) -> list[tuple[int, float]]:
    """Per step, the share of groups without signal that are not solved. A group counts as solved only
    when its step's best completion earns the best reward of the whole run, some completion of the run
    ever scored differently, and the run learned (its reward level over the first `window` steps was below
    `converged_reward_level`: `started_solved`): the live monitor's rule, health.py. In a run whose reward
    is always 0, or at its best from the first steps, every all-equal group is waste, not success."""
    pts = values(run, "frac_reward_zero_std")
    top = dict(values(run, "completions/reward_max"))
    span = reward_span(run) if top else None
    if span is None:
        return pts
    solved = dict(values(run, "completions/frac_groups_solved"))
    learned = not started_solved(run, hc)
    # the live monitor's rule (health_checks.unsolved_share) with the whole run's lowest and best reward
    return [
        (s, unsolved_share(v, solved.get(s, 0.0), top.get(s, -math.inf), span[1], span[0], learned)) for s, v in pts
    ]


def started_solved(run: Run, hc: HealthConfig) -> bool:
    """The live monitor's `solved_from_start` on the whole run: the reward level (between the run's lowest
    and highest completion reward) of every one of its first `window` steps (the doctor's window: shrunk for a
    short run), an outlier aside, already at `converged_reward_level`."""
    pts, span = values(run, "reward"), reward_span(run)
    if not pts or span is None or not values(run, "completions/reward_max"):
        return False
    levels = [lv for _, v in pts if (lv := reward_level(v, *span)) is not None]
    return solved_from_start(levels[: window(len(pts), hc)], hc)


def heldout_fall(run: Run) -> tuple[float, str] | None:
    """How far the latest held-out accuracy lies below the best one before it (peak - latest), with the
    evidence; None with fewer than 3 evaluations, or when it never rose above its baseline (a fall
    needs a rise first: heldout_gain measures the rest)."""
    pts = heldout_series(run)
    if len(pts) < 3:
        return None
    peak = max(pts[1:-1], key=lambda p: p[1])
    fall = peak[1] - pts[-1][1]
    if fall <= 0 or peak[1] <= pts[0][1]:  # never above its baseline: heldout_gain tells that story
        return None
    return fall, f"held-out accuracy {peak[1]:.3g} at its best (step {peak[0]}) -> {pts[-1][1]:.3g} (step {pts[-1][0]})"


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


def span_steps(span: str) -> tuple[int, int] | None:
    """(first, last) step of an evidence span "steps a-b" or "steps a-b vs c-d"."""
    nums = [int(x) for x in span.replace("steps ", "").replace(" vs ", "-").split("-") if x.strip().isdigit()]
    return (nums[0], nums[-1]) if nums else None
