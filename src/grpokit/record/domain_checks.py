"""The doctor's and the report's view of a run with domains (data.domains, docs/DOMAINS.md).

``check_interference`` has the signature of the doctor's checks (record/doctor.py's CHECKS): between
two held-out evaluations (summary.json's before, then every ``eval/domain/<d>/accuracy`` of
metrics.jsonl, then summary.json's after), it flags a domain whose accuracy fell by more than
``DoctorConfig.heldout_drop`` while another's rose by more than ``heldout_min_gain``: the gain of
one domain paid for by another (interference), with the steps and, under train.stages, the stage
that trained in between; record/doctor.py's CHECKS runs it. The report's panels per domain are
domain_panels.py's (re-exported here).
"""

from __future__ import annotations

from grpokit.config.health import HealthConfig

from .domain_panels import domain_names, domain_panels  # noqa: F401  (domain_panels re-exported)
from .findings import DoctorConfig, Finding
from .report_data import Run
from .run_series import values


def heldout_series(run: Run, domain: str) -> list[tuple[int, float]]:
    """(step, held-out accuracy) of one domain: before training, each evaluation, after training."""
    key = f"domain/{domain}/accuracy"
    pts = dict(values(run, f"eval/{key}"))
    before, after = run.summary.get("eval_before"), run.summary.get("eval_after")
    if isinstance(before, dict) and isinstance(before.get(key), (int, float)):
        pts.setdefault(0, float(before[key]))
    if isinstance(after, dict) and isinstance(after.get(key), (int, float)):
        last = run.summary.get("steps") or max((int(r.get("step", 0)) for r in run.metrics), default=0)
        pts.setdefault(int(last), float(after[key]))
    return sorted(pts.items())


def _stage_between(run: Run, a: int, b: int) -> str:
    stages = {int(v) for s, v in values(run, "stage") if a < s <= b}
    return f" (train.stages {', '.join(map(str, sorted(stages)))})" if stages else ""


def _panel(run: Run, domain: str) -> str:
    """The report's panel of a domain's reward and accuracy (domain_panels' id: domains in logged order)."""
    ordered = domain_names(list(dict.fromkeys(k for r in run.metrics for k in r)))
    return f"domain-{ordered.index(domain)}-0" if domain in ordered else ""


def check_interference(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    names = {k for r in run.metrics for k in r}
    for r in (run.summary.get("eval_before"), run.summary.get("eval_after")):
        names |= {f"eval/{k}" for k in r} if isinstance(r, dict) else set()
    series = {d: dict(heldout_series(run, d)) for d in domain_names(names)}
    steps = sorted({s for pts in series.values() for s in pts})
    for a, b in zip(steps, steps[1:]):
        moved = {d: pts[b] - pts[a] for d, pts in series.items() if a in pts and b in pts}
        fell = [(d, m) for d, m in moved.items() if m < -dc.heldout_drop]
        rose = [(d, m) for d, m in moved.items() if m > dc.heldout_min_gain]
        if fell and rose:
            lost, won = min(fell, key=lambda x: x[1])[0], max(rose, key=lambda x: x[1])[0]
            ls, ws = series[lost], series[won]
            return Finding(
                "domain_interference",
                f"Domain {lost!r} got worse on held-out prompts while {won!r} improved (interference)",
                f"between step {a} and step {b}{_stage_between(run, a, b)}: held-out accuracy of {lost} "
                f"{ls[a]:.3g} -> {ls[b]:.3g}, of {won} {ws[a]:.3g} -> {ws[b]:.3g}",
                f"train the domains in rounds (train.stages) or give {lost!r} a larger share "
                f"(data.domains.{lost}.share); evaluate more often (train.eval_every) to see when it starts",
                0.7,
                panel=_panel(run, lost),
                steps=(a, b),
            )
    return None
