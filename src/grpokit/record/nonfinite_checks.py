"""The doctor's checks of non-finite values (record/doctor.py): a loss, gradient norm, KL, entropy or reward
that was NaN or inf at some steps. The other checks read a metric's finite values only
(run_series.values), so without these the steps where it was NaN or inf would go unseen.

Two findings, as two watchers: `nonfinite_updates` is the live monitor's problem (HealthMonitor's
`nonfinite`, health.py), read by its rule: a step whose `health.nonfinite_keys` (loss, grad_norm) are not
finite had its update skipped, and `health.max_nonfinite_steps` such steps in a row stop a run of
grpokit's. The doctor calls such a run an error, and so one that lost `DoctorConfig.nonfinite_share` of its
logged steps that way (and at least health.max_nonfinite_steps of them), scattered or not; fewer are a
warning. A run of grpokit's is warned of it by the live monitor, so the live doctor leaves it to that one
(doctor_live.LIVE_MONITORED); TRL's DoctorCallback has no live monitor and warns of it itself.
`nonfinite_metrics`: each other metric the checks read (run_series.COVERAGE), judged alone by the same
rule: a KL, entropy or reward that stays NaN or inf is a run gone bad too (NaN logits, a policy off the
reference's support, reward functions that score nothing). No live monitor watches these.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from grpokit.config.health import HealthConfig

from .config_advice import clipping, joined, precision
from .findings import DoctorConfig, Finding
from .health_checks import nonfinite
from .report_data import GROUPS, Run
from .run_series import COVERAGE, config_value

# What a series' non-finite values usually mean, for the advice (the update keys' advice is the monitor's)
MEANS = {
    "kl": "a KL that overflows means a policy far from the reference, or tokens the reference gives no "
    "probability: lower optim.lr, raise algo.beta",
    "entropy": "a non-finite entropy means non-finite logits: the weights went bad",
    "reward": "no completion of those steps got a finite reward (every reward function returned None or NaN): "
    "read the reward functions' logged errors",
}


@dataclass(frozen=True)
class NonFinite:
    """One series' non-finite steps: `keys` (health.nonfinite_keys together, or one metric), the `steps`
    whose value was NaN, inf or no number, the longest `streak` of them in a row and how many steps
    `logged` the series at all."""

    keys: tuple[str, ...]
    steps: list[int]
    streak: int
    logged: int

    def severe(self, hc: HealthConfig, dc: DoctorConfig) -> bool:
        """As many in a row as stop a run of grpokit's (health.max_nonfinite_steps), or as many scattered ones
        that are also at least `nonfinite_share` of the logged steps."""
        many = len(self.steps) >= max(hc.max_nonfinite_steps, dc.nonfinite_share * self.logged)
        return self.streak >= hc.max_nonfinite_steps or many


def series_read(hc: HealthConfig) -> list[tuple[str, ...]]:
    """The series judged: `health.nonfinite_keys` together (as the live monitor reads them), then each other
    metric the doctor's checks read."""
    update = tuple(hc.nonfinite_keys)
    others = [k for _, keys in COVERAGE for k in keys if not k.startswith("@") and k not in update]
    return ([update] if update else []) + [(k,) for k in dict.fromkeys(others)]


def nonfinite_series(run: Run, keys: tuple[str, ...]) -> NonFinite:
    """The steps of `run` where any of `keys` is not finite (rows that log none of them neither count nor
    break a streak, as in the live monitor)."""
    steps: list[int] = []
    streak = longest = logged = 0
    for r in run.metrics:
        s = r.get("step")
        if not isinstance(s, (int, float)) or isinstance(s, bool) or not any(k in r for k in keys):
            continue
        logged += 1
        if nonfinite(r, keys):
            steps.append(int(s))
            streak += 1
            longest = max(longest, streak)
        else:
            streak = 0
    return NonFinite(keys, steps, longest, logged)


def nonfinite_found(run: Run, hc: HealthConfig) -> list[NonFinite]:
    """Every series read by the doctor with a non-finite value, the update keys first."""
    return [n for keys in series_read(hc) if (n := nonfinite_series(run, keys)).steps]


def spans(steps: list[int], most: int = 6) -> str:
    """[3, 4, 5, 9] -> "3-5, 9": runs of consecutive steps, the first `most` of them."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    shown = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs[:most])
    return shown + (f" (+{len(runs) - most} more)" if len(runs) > most else "")


def _evidence(found: list[NonFinite], hc: HealthConfig) -> str:
    """One clause per set of steps: series non-finite at the same steps are named together."""
    alike: dict[tuple[tuple[int, ...], int, int], list[str]] = {}
    for n in found:
        alike.setdefault((tuple(n.steps), n.logged, n.streak), []).append(" or ".join(n.keys))
    parts = []
    for (steps, logged, streak), names in alike.items():
        row = f", {streak} in a row" if streak > 1 else ""
        stop = (
            f" (a run of grpokit's stops at health.max_nonfinite_steps={hc.max_nonfinite_steps})"
            if streak >= hc.max_nonfinite_steps
            else ""
        )
        parts.append(
            f"{', '.join(names)} non-finite at {len(steps)} of {logged} steps ({spans(list(steps))}){row}{stop}"
        )
    return "; ".join(parts)


def _panel(key: str) -> str:
    return next((pid for pid, _, pats in GROUPS if any(fnmatch.fnmatchcase(key, p) for p in pats)), "")


def _severe_advice(severe: bool) -> str:
    return (
        "read the samples of the first such step; once the weights are non-finite no later step recovers: go back "
        "to a checkpoint from before it (see the note on where to resume)"
        if severe
        else ""
    )


def check_nonfinite_updates(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """`nonfinite_updates`: the update keys (health.nonfinite_keys: loss, grad_norm) NaN or inf, what the live
    `nonfinite` monitor warns about step by step in a run of grpokit's (doctor_live.LIVE_MONITORED)."""
    update = tuple(hc.nonfinite_keys)
    n = nonfinite_series(run, update) if update else None
    if n is None or not n.steps:
        return None
    severe = n.severe(hc, dc)
    fixes = joined(
        f"lower optim.lr (now {config_value(run, 'optim.lr')})",
        clipping(run),
        precision(run),
        "check the reward functions for NaN",
    )
    advice = (
        "those steps' updates were lost (grpokit skips them; another trainer may apply them and turn the weights "
        f"non-finite): {fixes}"
    )
    return Finding(
        "nonfinite_updates",
        f"Non-finite {' or '.join(n.keys)}: updates lost" + (" (the run went bad)" if severe else ""),
        _evidence([n], hc),
        "; ".join(a for a in (advice, _severe_advice(severe)) if a),
        0.9 if severe else 0.65,
        panel=_panel(n.keys[-1]),
        steps=(n.steps[0], n.steps[-1]),
    )


def check_nonfinite_metrics(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """`nonfinite_metrics`: another metric the checks read (kl, entropy, reward ...) NaN or inf, each judged alone;
    no live monitor watches these, so the doctor warns about them in a run of grpokit's too."""
    found = [n for n in nonfinite_found(run, hc) if n.keys != tuple(hc.nonfinite_keys)]
    if not found:
        return None
    severe = [n for n in found if n.severe(hc, dc)]
    advice = [*(MEANS[n.keys[0]] for n in found if n.keys[0] in MEANS), _severe_advice(bool(severe))]
    first = severe[0] if severe else found[0]
    return Finding(
        "nonfinite_metrics",
        f"Non-finite {', '.join(n.keys[0] for n in found)}" + (" (the run went bad)" if severe else ""),
        _evidence(found, hc),
        "; ".join(a for a in advice if a),
        0.9 if severe else 0.5,
        panel=_panel(first.keys[-1]),
        steps=(min(n.steps[0] for n in found), max(n.steps[-1] for n in found)),
    )
