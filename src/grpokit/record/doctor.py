"""`grpokit doctor RUN`: read a finished (or running) run and say what looks wrong, why, and what to try.

The health monitors (health.py) watch a run step by step and warn early; the doctor reads the whole
run afterwards (config.yaml, metrics.jsonl, summary.json; samples.jsonl for the best recent sample that
the reward-hacking findings quote) and answers the questions users ask about a GRPO run that went
wrong. Each check is a small function of the run's metrics (and config) that returns a `Finding` with
its evidence (steps and numbers) and one concrete change to try, or None. Findings are ranked by `score` (how likely the
problem cost the run its learning), highest first.

Thresholds the health monitors already have (entropy floor and drop ratio, zero-std share, length
growth, KL and clip limits, reward-failure share, the converged reward level, the window, the
non-finite keys) are read
from the run's own `health` config section, so the doctor and the live alarms agree; only what the
monitors do not watch has a threshold here (`DoctorConfig`).

"early" is the mean of a metric's first `window` values, "recent" of its last `window`, with the
window shrunk to a third of the run for short runs; trend checks need at least 6 values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields

from grpokit.config.health import HealthConfig

from .findings import DoctorConfig, Finding
from .learning_checks import (
    check_component_alone,
    check_entropy,
    check_heldout,
    check_heldout_drop,
    check_length,
    check_truncation,
    check_zero_std,
)
from .report_data import Run
from .stability_checks import (
    check_env_failures,
    check_grad_spikes,
    check_mismatch,
    check_reward_failures,
    check_runaway,
    check_throughput,
)

__all__ = ["CHECKS", "DoctorConfig", "Finding", "diagnose", "format_findings", "health_config"]
CHECKS: tuple[Callable[[Run, HealthConfig, DoctorConfig], Finding | None], ...] = (
    check_heldout,
    check_heldout_drop,
    check_component_alone,
    check_length,
    check_entropy,
    check_zero_std,
    check_truncation,
    check_runaway,
    check_grad_spikes,
    check_mismatch,
    check_reward_failures,
    check_env_failures,
    check_throughput,
)


def health_config(run: Run) -> HealthConfig:
    """The run's own health thresholds (its config's `health` section), defaults for the rest."""
    section = run.config.get("health") if isinstance(run.config.get("health"), dict) else {}
    names = {f.name for f in fields(HealthConfig)}
    try:
        return HealthConfig(**{k: v for k, v in section.items() if k in names})
    except (TypeError, ValueError):
        return HealthConfig()


def diagnose(run: Run, dc: DoctorConfig = DoctorConfig()) -> list[Finding]:
    """Every finding for `run`, most important first."""
    hc = health_config(run)
    return sorted((f for check in CHECKS if (f := check(run, hc, dc)) is not None), key=lambda f: -f.score)


def format_findings(findings: Sequence[Finding], name: str) -> str:
    if not findings:
        return f"grpokit doctor: {name}: nothing to fix found."
    lines = [f"grpokit doctor: {name}: {len(findings)} finding(s), most important first"]
    for i, f in enumerate(findings, 1):
        lines += [f"{i}. [{f.code}] {f.title}", f"   evidence: {f.evidence}", f"   try: {f.advice}"]
    return "\n".join(lines)
