"""What a run cost and where to go back (record/doctor.py prints these as notes).

- rollouts paid per useful one: a group whose completions all scored alike has zero advantage and
  teaches nothing, yet its G completions were sampled, scored and back-propagated; with a share z of
  such groups, 1 / (1 - z) rollouts are paid for each one that carries signal;
- compute after the last held-out improvement: steps (and seconds, where `time/step` is logged) that
  ran after the held-out accuracy last beat its best by more than `heldout_min_gain`;
- the step to resume from: for a run that went bad (a non-finite loss or gradient norm, another metric the
  doctor reads non-finite as long or as often as makes `nonfinite_metrics` an error, a gradient spike, KL
  above its limit, held-out accuracy falling), the onset and the last checkpoint saved before it.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from grpokit.config.health import HealthConfig

from .findings import DoctorConfig
from .nonfinite_checks import nonfinite_found
from .report_data import Run
from .run_series import heldout_series, last_step, values


@dataclass(frozen=True)
class Note:
    """A fact about the run that is not a fault: its cost, where to resume, what could not be checked."""

    code: str
    text: str
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rollouts_per_useful(run: Run) -> Note | None:
    pts = values(run, "frac_reward_zero_std")
    if not pts:
        return None
    z = statistics.fmean(v for _, v in pts)
    paid = "every rollout was wasted" if z >= 1 else f"{1 / (1 - z):.2g} rollouts paid per useful one"
    return Note(
        "rollouts_per_useful",
        f"{paid}: {z:.0%} of groups carried no signal (all completions scored alike)",
        f"frac_reward_zero_std averages {z:.3g} over steps {pts[0][0]}-{pts[-1][0]}",
    )


def after_last_improvement(run: Run, dc: DoctorConfig) -> Note | None:
    pts = heldout_series(run)
    if len(pts) < 2:
        return None
    best, best_step = pts[0][1], pts[0][0]
    for s, a in pts[1:]:
        if a > best + dc.heldout_min_gain:
            best, best_step = a, s
    end = last_step(run)
    if end <= 0:
        return None
    secs = sum(v for s, v in values(run, "time/step") if s > best_step)
    share = (end - best_step) / end
    return Note(
        "after_last_improvement",
        f"{end - best_step} of {end} steps ({share:.0%})"
        + (f", {secs:.0f} s," if secs else "")
        + f" ran after the last held-out improvement (step {best_step}, accuracy {best:.3g})",
        "held-out accuracy " + ", ".join(f"{a:.3g} (step {s})" for s, a in pts[-6:]),
    )


def onset(run: Run, hc: HealthConfig, dc: DoctorConfig) -> tuple[int, str] | None:
    """The first step where the run went bad, and why; None for a run that did not."""
    # the first non-finite update (nonfinite_checks.py: its rule, one with the live monitor), or the first non-finite
    # value of another metric the doctor reads where that metric went bad (severe): one NaN entropy, a warning,
    # does not move the point to resume from before it
    found = [
        (n.steps[0], f"non-finite {' or '.join(n.keys)}")
        for n in nonfinite_found(run, hc)
        if n.keys == tuple(hc.nonfinite_keys) or n.severe(hc, dc)
    ]
    grad = values(run, "grad_norm")
    med = statistics.median(v for _, v in grad) if len(grad) >= 6 else 0.0
    found += [
        (s, f"grad_norm {v:.3g} > {dc.grad_spike_ratio:g}x median")
        for s, v in grad
        if med and v > dc.grad_spike_ratio * med
    ][:1]
    found += [(s, f"kl {v:.3g} > health.kl_max {hc.kl_max:g}") for s, v in values(run, "kl") if v > hc.kl_max][:1]
    heldout = heldout_series(run)
    if len(heldout) >= 2:
        top = max(range(len(heldout)), key=lambda i: heldout[i][1])
        peak = heldout[top]
        after = [(s, a) for s, a in heldout[top + 1 :] if a < peak[1] - dc.heldout_drop]
        if after:
            found.append(
                (
                    peak[0] + 1,
                    f"held-out accuracy fell from {peak[1]:.3g} (step {peak[0]}) "
                    f"to {after[0][1]:.3g} (step {after[0][0]})",
                )
            )
    return min(found, key=lambda f: f[0]) if found else None  # at one step, the first named (the update's)


def checkpoints(run: Run) -> list[int]:
    """Steps of the checkpoints in the run folder: grpokit's checkpoints/step-N, transformers' checkpoint-N."""
    steps = []
    for d in [run.path / "checkpoints", run.path]:
        if d.is_dir():
            for p in d.iterdir():
                m = re.fullmatch(r"(?:step-|checkpoint-)0*(\d+)", p.name)
                if m and p.is_dir():
                    steps.append(int(m.group(1)))
    return sorted(set(steps))


def resume_from(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Note | None:
    bad = onset(run, hc, dc)
    if bad is None:
        return None
    step, why = bad
    before = [c for c in checkpoints(run) if c < step]
    if before:
        where = f"resume from the checkpoint of step {before[-1]}, the last saved before the onset"
    elif step <= 1:
        where = "nothing before it is worth keeping: restart with the change the findings suggest"
    else:
        where = f"no checkpoint before the onset in {run.path}: restart, saving checkpoints more often"
    return Note("resume_from", f"the run went bad at step {step}: {where}", why)


def cost_notes(run: Run, hc: HealthConfig, dc: DoctorConfig) -> list[Note]:
    return [n for n in (rollouts_per_useful(run), after_last_improvement(run, dc), resume_from(run, hc, dc)) if n]
