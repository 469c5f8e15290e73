"""The doctor's check of completions that no reward function scored (record/doctor.py).

A reward function may answer None for a completion it cannot judge ("not applicable": TRL's multi-task
rewards, a domain's rewards off its domain); the runner counts them per function
(`rewards/<f>/not_applicable`) and counts the completions that every function answered None for
(`rewards/unscored`). Such a completion gets no reward: advantage 0, left out of its group's statistics,
0 in the logged reward. A run whose completions mostly went unscored looks like a run whose reward is
constant, or whose groups carry no signal; this check names the cause, ranked above those findings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpokit.config.health import HealthConfig

from .findings import DoctorConfig, Finding
from .health_checks import batch_items
from .report_data import Run
from .run_series import config_value

EPS = 1e-9


@dataclass(frozen=True)
class Unscored:
    """The completions no reward function scored (every one answered None, "not applicable")."""

    share: float | None
    """Their share of the completions scored over the run: `rewards/unscored` / `rewards/scored`, or, without
    `rewards/unscored`, one function's `not_applicable` share when the run has one function; None: unknown."""
    per_function: dict[str, tuple[float, float]]
    """Each function with any None: (its `rewards/<f>/not_applicable` total, the completions it was given)."""
    items: float = 0.0
    """The completions over the steps counted (`rewards/scored`, else the run config's batch size per step)."""
    steps: tuple[int, int] | None = None


def unscored(run: Run) -> Unscored:
    """How many completions went without a reward (rewards/runner.py's `rewards/unscored`), per function too."""
    per_step = batch_items(run.config)
    names = dict.fromkeys(k[8:-15] for r in run.metrics for k in r if k.startswith("rewards/") and k.endswith(NA))
    rows = [r for r in run.metrics if any(f"rewards/{n}{NA}" in r for n in names) or "rewards/unscored" in r]
    items = [(r, _num(r.get("rewards/scored")) or per_step) for r in rows]
    items = [(r, n) for r, n in items if n]
    if not items:
        return Unscored(None, {})
    total = sum(n for _, n in items)
    per = {f: (sum(_num(r.get(f"rewards/{f}{NA}")) or 0.0 for r, _ in items), total) for f in names}
    none = [_num(r.get("rewards/unscored")) for r, _ in items]
    if all(v is not None for v in none):
        share = sum(v or 0.0 for v in none) / total
    else:  # a run from before `rewards/unscored`: one function's None is the completion's
        share = per[next(iter(names))][0] / total if len(names) == 1 else None
    steps = [int(r["step"]) for r, _ in items if isinstance(r.get("step"), (int, float))]
    return Unscored(share, {f: c for f, c in per.items() if c[0]}, total, (min(steps), max(steps)) if steps else None)


NA = "/not_applicable"


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def check_unscored(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """Completions that every reward function answered None for (not applicable) get no reward: advantage 0,
    left out of their group's statistics, so they teach nothing; their groups read as groups without signal."""
    u = unscored(run)
    if u.share is None or u.share <= dc.unscored_max:
        return None
    every = u.share >= 1 - EPS
    per = "; ".join(f"{f} answered None for {c:.0f} of {n:.0f} ({c / n:.0%})" for f, (c, n) in u.per_function.items())
    where = f" over steps {u.steps[0]}-{u.steps[1]}" if u.steps else ""
    return Finding(
        "unscored_completions",
        "No completion was scored: every reward function answered None (not applicable)"
        if every
        else f"{u.share:.0%} of completions got no reward: every reward function answered None for them",
        f"{u.share * u.items:.0f} of {u.items:.0f} completions{where} had no score" + (f"; {per}" if per else ""),
        "an unscored completion gets advantage 0 and is left out of its group, so it teaches nothing (and counts 0 "
        "in the logged reward): return a number (0 for a wrong answer) for every completion the function can judge, "
        "keeping None for those another function scores; check what the function reads (its columns, the answer "
        f"format) in reward.functions ({config_value(run, 'reward.functions')})",
        0.99 if u.share >= 0.5 else 0.6,  # above reward_constant and zero_std_groups, which it explains
        panel="faults",
        steps=u.steps,
    )
