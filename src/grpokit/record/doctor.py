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

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from grpokit.config.health import HealthConfig

from .cost import Note, cost_notes
from .domain_checks import check_interference
from .findings import DoctorConfig, Finding
from .hacking_checks import check_components_diverge, check_format_over_accuracy, check_repetition, check_same_length
from .learning_checks import (
    check_component_alone,
    check_entropy,
    check_heldout,
    check_heldout_drop,
    check_length,
    check_truncation,
    check_zero_std,
)
from .nonfinite_checks import check_nonfinite_metrics, check_nonfinite_updates
from .report_data import Run
from .run_series import COVERAGE, heldout_series, last_step
from .signal_checks import (
    check_clip_asymmetry,
    check_constant_component,
    check_kl_pinned,
    check_plateau,
    check_reward_constant,
    check_reward_std_death,
    check_small_group,
    check_tight_clip,
    check_zero_grad,
)
from .stability_checks import (
    check_env_failures,
    check_grad_spikes,
    check_mismatch,
    check_reward_failures,
    check_run_failed,
    check_run_killed,
    check_runaway,
    check_throughput,
)
from .unscored_checks import check_unscored

__all__ = ["CHECKS", "Diagnosis", "DoctorConfig", "Finding", "diagnose", "examine", "format_findings", "health_config"]
CHECKS: tuple[Callable[[Run, HealthConfig, DoctorConfig], Finding | None], ...] = (
    check_run_failed,
    check_unscored,
    check_reward_constant,
    check_heldout,
    check_heldout_drop,
    check_interference,
    check_format_over_accuracy,
    check_component_alone,
    check_components_diverge,
    check_constant_component,
    check_same_length,
    check_repetition,
    check_length,
    check_entropy,
    check_reward_std_death,
    check_zero_std,
    check_small_group,
    check_zero_grad,
    check_plateau,
    check_truncation,
    check_runaway,
    check_kl_pinned,
    check_clip_asymmetry,
    check_tight_clip,
    check_nonfinite_updates,
    check_nonfinite_metrics,
    check_grad_spikes,
    check_mismatch,
    check_reward_failures,
    check_env_failures,
    check_throughput,
)
# The report panel (report_data.GROUPS id) of the checks that do not name theirs.
PANELS = {
    "reward_hacking_heldout": "eval",
    "heldout_drop": "eval",
    "reward_component_alone": "reward",
    "length_growth": "length",
    "length_with_reward": "length",
    "entropy_collapse": "entropy",
    "zero_std_groups": "signal",
    "truncated": "truncated",
    "kl_clip_runaway": "kl",
    "grad_spikes": "grad-norm",
    "reward_failures": "faults",
    "env_failures": "faults",
    "throughput": "time",
}
# Findings that only restate another one's symptom: dropped when that one is found (the cause is named).
SUBSUMED_BY = {
    "reward_component_alone": ("format_over_accuracy", "reward_components_diverge"),
    "zero_std_groups": ("reward_constant",),
    "small_group": ("reward_constant",),
    "zero_grad_steps": ("reward_constant",),
    "reward_std_death": ("reward_constant",),
}
TREND_STEPS = 6  # run_series.trend needs this many values


@dataclass
class Diagnosis:
    """The doctor's answer: findings (most important first) and notes (cost, where to resume, how
    the run ended, what could not be checked for want of a metric)."""

    findings: list[Finding]
    notes: list[Note] = field(default_factory=list)
    steps: int = 0

    def worst(self) -> str | None:
        """The highest level among the findings ("error", "warning", "info"), None without any."""
        order = ("info", "warning", "error")
        return max((f.level for f in self.findings), key=order.index, default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "findings": [f.to_dict() for f in self.findings],
            "notes": [n.to_dict() for n in self.notes],
        }


def health_config(run: Run, overrides: dict[str, Any] | None = None) -> HealthConfig:
    """The run's own health thresholds (its config's `health` section) with `overrides` on top,
    defaults for the rest."""
    section = run.config.get("health") if isinstance(run.config.get("health"), dict) else {}
    names = {f.name for f in fields(HealthConfig)}
    try:
        return HealthConfig(**{k: v for k, v in (section | (overrides or {})).items() if k in names})
    except (TypeError, ValueError):
        return HealthConfig()


def _located(f: Finding) -> Finding:
    """The finding with its report panel and evidence steps filled in where the check left them out."""
    if f.panel and f.steps:
        return f
    spans = re.findall(r"\bsteps? (\d+)(?:-(\d+))?(?: vs (\d+)-(\d+))?", f.evidence)
    nums = [int(x) for span in spans for x in span if x]
    return dataclasses.replace(
        f, panel=f.panel or PANELS.get(f.code, ""), steps=f.steps or ((min(nums), max(nums)) if nums else None)
    )


def diagnose(run: Run, dc: DoctorConfig = DoctorConfig(), hc: HealthConfig | None = None) -> list[Finding]:
    """Every finding for `run`, most important first."""
    hc = hc or health_config(run)
    found = [_located(f) for check in CHECKS if (f := check(run, hc, dc)) is not None]
    codes = {f.code for f in found}
    found = [f for f in found if not codes & set(SUBSUMED_BY.get(f.code, ()))]
    # a plateau is a symptom: when a likelier cause is named, that is the finding
    if any(f.code != "plateau" and f.score >= 0.6 for f in found):
        found = [f for f in found if f.code != "plateau"]
    return sorted(found, key=lambda f: -f.score)


def run_notes(run: Run) -> list[Note]:
    """How the run ended and what could not be checked: a doctor silent for want of data must say so."""
    notes = []
    n = len(run.metrics)
    status = run.status  # failed or died: a finding (run_failed, run_killed)
    state = status.state
    if state == "stopped":
        sig = run.summary.get("stop_signal", "a signal")
        notes.append(
            Note("stopped", f"the run was stopped by {sig} at step {last_step(run)}, before its final evaluation")
        )
    elif state == "running":
        notes.append(
            Note(
                "in_progress",
                f"the run has not finished ({status.why or 'a live process holds run.lock'}; summary.json has no "
                f"steps): read at step "
                f"{last_step(run)}",
            )
        )
    notes += alarm_notes(run)
    if n < TREND_STEPS:
        notes.append(
            Note(
                "too_short",
                f"{n} step(s) logged: the trend checks (entropy, length, KL growth, plateau ...) need "
                f"{TREND_STEPS}; only the level checks ran",
            )
        )
    keys = {k for r in run.metrics for k in r}
    for topic, needs in COVERAGE:
        have = bool(heldout_series(run)) if needs == ("@heldout",) else any(k in keys for k in needs)
        if not have:
            want = (
                "a held-out evaluation (eval/accuracy or summary.json)"
                if needs == ("@heldout",)
                else " or ".join(needs)
            )
            notes.append(Note("not_checked", f"not checked: {topic}, for want of {want}"))
    return notes


def alarm_notes(run: Run) -> list[Note]:
    """The live health monitor's warnings (health.jsonl), one note per monitor: what the run said while it ran is
    part of the doctor's answer, also where no check of the doctor's restates it."""
    fired: dict[str, list[dict[str, Any]]] = {}
    for e in run.events:
        if e.get("level", "warning") == "warning" and isinstance(e.get("monitor"), str):
            fired.setdefault(e["monitor"], []).append(e)
    notes = []
    for monitor, events in fired.items():
        steps = sorted({int(e["step"]) for e in events if isinstance(e.get("step"), (int, float))})
        shown = ", ".join(map(str, steps[:8])) + (f" (+{len(steps) - 8} more)" if len(steps) > 8 else "")
        notes.append(
            Note(
                "live_alarm",
                f"the live {monitor} alarm fired {len(events)} time(s) (step(s) {shown})",
                str(events[-1].get("message", "")),
            )
        )
    return notes


def examine(run: Run, dc: DoctorConfig = DoctorConfig(), health: dict[str, Any] | None = None) -> Diagnosis:
    """The whole answer for `run`: findings, cost, where to resume, what was not checked."""
    hc = health_config(run, health)
    killed = check_run_killed(run)  # read from the folder, not from the metrics: not one of CHECKS (live too)
    findings = sorted(diagnose(run, dc, hc) + ([killed] if killed else []), key=lambda f: -f.score)
    cost = cost_notes(run, hc, dc)
    if not any(f.level == "error" for f in findings):
        cost = [c for c in cost if c.code != "resume_from"]  # only a run that went bad needs a way back
    steps = len({int(r["step"]) for r in run.metrics if isinstance(r.get("step"), (int, float))})
    return Diagnosis(findings, cost + run_notes(run), steps)


def format_findings(findings: Sequence[Finding] | Diagnosis, name: str) -> str:
    diag = findings if isinstance(findings, Diagnosis) else Diagnosis(list(findings))
    if not diag.findings:
        lines = [f"grpokit doctor: {name}: nothing to fix found."]
    else:
        lines = [f"grpokit doctor: {name}: {len(diag.findings)} finding(s), most important first"]
    for i, f in enumerate(diag.findings, 1):
        lines += [f"{i}. [{f.code}] {f.title}", f"   evidence: {f.evidence}", f"   try: {f.advice}"]
    if diag.notes:
        lines.append("notes:")
        lines += [f"- {n.text}" + (f" ({n.evidence})" if n.evidence else "") for n in diag.notes]
    return "\n".join(lines)
