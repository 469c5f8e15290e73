"""The doctor's checks while a run goes: one set of checks for `grpokit doctor`, the live health
monitor of `grpokit train` (health.py) and DoctorCallback in someone else's Trainer.

``DoctorWatch`` keeps the rows a run has logged and, every ``every`` rows (every tenth of the run
so far once that is longer: a check reads the whole run), runs the doctor's ``CHECKS`` (doctor.py) on
them; each finding is returned once, the first time it appears, and once more each time its level
rises (a few skipped updates are a warning, as many in a row as stop a run an error), so that
DoctorCallback's `stop_on="error"` sees it. Codes in ``skip`` are left to whoever already watches them
(the live monitors' own alarms for zero-std groups, entropy, length, KL and clipping, same-length groups
and reward failures: the doctor decides those with the live monitor's own rule, run_series.live_alarm;
non-finite loss or grad_norm, which the `nonfinite` monitor warns of at every such step and stops the run on),
so a run is warned once per problem, not twice under two names. What only the doctor reads (held-out
accuracy, a failure rate rising over the run, hacking signatures) it warns as it appears.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .doctor import diagnose, health_config
from .findings import LEVELS, DoctorConfig, Finding
from .report_data import Run

# Doctor findings whose problem a live health monitor (health_checks.MONITORS) already warns about.
LIVE_MONITORED = frozenset(
    {
        "zero_std_groups",
        "entropy_collapse",
        "length_growth",
        "kl_clip_runaway",
        "same_length_groups",
        "reward_failures",
        "nonfinite_updates",
    }
)


@dataclass
class DoctorWatch:
    """The run so far and the findings already reported; feed it one row of metrics per log."""

    every: int = 10
    config: DoctorConfig = field(default_factory=DoctorConfig)
    health: dict[str, Any] = field(default_factory=dict)
    """Health thresholds on top of the run config's `health` section (HealthConfig field names)."""
    run_config: dict[str, Any] = field(default_factory=dict)
    path: Path = Path(".")
    skip: frozenset[str] = frozenset()
    rows: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)
    """Each finding returned so far (by code) and the highest level it was returned at."""
    _added: int = 0
    _checked: int = 0

    def add(self, row: dict[str, Any]) -> list[Finding]:
        """Add one logged row (with its "step"); every `every` rows, return the findings not seen before.
        Rows of one step (a train log and an eval log) merge; non-numbers are dropped."""
        row = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.rows and row.get("step") == self.rows[-1].get("step"):
            self.rows[-1] |= {k: v for k, v in row.items() if k not in self.rows[-1]}
        else:
            self.rows.append(row)
        self._added += 1
        # every `every` rows, and less often as the run grows (each check reads the whole run: at most
        # ~10% more reading than the rows themselves), so a 10,000-step run is not slowed down
        if self._added - self._checked < max(self.every, len(self.rows) // 10):
            return []
        self._checked = self._added
        return self.check()

    def check(self) -> list[Finding]:
        run = Run(self.path, self.path.name, metrics=list(self.rows), config=self.run_config)
        found = diagnose(run, self.config, health_config(run, self.health))
        rank = LEVELS.index
        new = [
            f
            for f in found
            if f.code not in self.skip and (f.code not in self.seen or rank(f.level) > rank(self.seen[f.code]))
        ]
        self.seen.update((f.code, f.level) for f in new)
        return new
