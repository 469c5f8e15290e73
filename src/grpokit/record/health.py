"""Health monitors: notice the classic ways a GRPO run goes wrong, and say what to try.

A GRPO run can look busy while learning nothing. The failures below are common enough to watch for
on every step; each monitor reads the step's metrics dict (the same one the sinks receive), decides
whether its failure is present, and if so produces one sentence saying what is wrong and what to try.

    monitor          reads                                     fires when (recent = mean of last `window` steps)
    entropy_collapse entropy, reward                           recent < entropy_drop_ratio x early, or recent <
                                                               entropy_min while the reward no longer rises (recent
                                                               window < reward_flat_tol above the one before)
    zero_std_groups  frac_reward_zero_std                      recent > zero_std_max, or the run so far's mean
                                                               share (solved groups discounted) > zero_std_run_max
    length_inflation completions/mean_length, reward           length grew x length_growth_ratio, reward flat
    kl_runaway       kl                                        recent > kl_max
    clip_runaway     clip_ratio/region_mean                    recent > clip_ratio_max
    same_length      completions/frac_groups_same_length       recent > same_length_max
    same_text        completions/frac_groups_same_text         recent > same_text_max
    reward_failures  rewards/failed_fraction, rewards/*/zeroed recent failed + zeroed share > reward_failure_max
                                                               (no warmup; zeroed over train.prompts_per_step x
                                                               rollout.group_size items)
    nonfinite        loss, grad_norm                           non-finite; fatal after max_nonfinite_steps in a row

Convergence is not a failure. Three signals are also what a run that has learned its task looks like:
identical completions and all-equal rewards in a group once its prompt is solved, and low entropy once
accuracy nears 100%. When the trainer adds `solved_signatures` (per-group rewards) to its metrics, those
monitors discount solved groups (every completion earns the run's best reward) and read the reward
level (recent mean reward placed between the lowest and highest completion reward seen in the run);
when what remains is below the threshold, or the level is at least `converged_reward_level`, the
monitor reports "converged" once as information (level "info", `health/converged` 1.0) instead of
warning. Without those metrics they warn. Convergence is learned: a run whose reward level was already
at `converged_reward_level` over its first `window` steps (every group solved before any update: a
verifier that accepts everything, prompts the model already solves) has its solved groups counted as
waste and warns (health_checks.solved_from_start).

"early" is the mean of the first `window` observations. No trend monitor fires before it has seen
2 x `window` steps (early and recent windows must not overlap) and no monitor fires before
`warmup_steps`: the first steps of a run are noisy and their values say little.

Monitors report through the recorder: `health/{monitor}` is 1.0 in the metrics while a monitor fires
(0.0 when it has data and is quiet), a warning is printed and written to health.jsonl when it starts
firing (and again every `repeat_every` steps while it keeps firing). Only the non-finite monitor
stops training, by raising `TrainingHealthError`: a run whose loss stays NaN cannot recover.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from grpokit.config.health import HealthConfig

from .health_checks import (
    LEVEL_KEY,
    MONITORS,
    SAME_REWARD,
    SOLVED_KEYS,
    UNSOLVED_KEYS,
    ZEROED_KEY,
    Reading,
    Series,
    batch_items,
    nonfinite,
    reward_level,
    solved_from_start,
    unsolved_share,
    zeroed_share,
)
from .health_checks import finite as _finite
from .signatures import group_signatures, solved_signatures  # noqa: F401  (re-exported)


class TrainingHealthError(RuntimeError):
    """Raised when training cannot usefully continue (e.g. the loss was NaN for K steps in a row)."""


@dataclass(frozen=True)
class HealthEvent:
    """One warning: which monitor fired at which step, its advice, and the value that triggered it."""

    step: int
    monitor: str
    message: str
    value: float = math.nan
    level: str = "warning"  # "warning": something to fix; "info": a converged run, nothing to fix

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HealthMonitor:
    """Feeds each step's metrics to every monitor; remembers which fire and how many NaN steps in a row.

    Use: `events, health_metrics = monitor.observe(metrics, step)` then `monitor.raise_if_fatal()`.
    The Recorder does exactly this in `log`, so a trainer using a Recorder need not call it.
    """

    config: HealthConfig = field(default_factory=HealthConfig)
    run_config: dict[str, Any] = field(
        default_factory=dict
    )  # the run's resolved config: the doctor's advice names its values
    nonfinite_streak: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    _history: dict[str, Series] = field(default_factory=dict)
    _last_warned: dict[str, int] = field(default_factory=dict)
    _informed: set[str] = field(default_factory=set)
    _best: float = -math.inf  # highest completion reward seen in the run
    _floor: float = math.inf  # lowest completion reward seen in the run
    doctor: Any = None
    """A doctor_live.DoctorWatch fed every step: its findings on the run so far become events (None: off)."""
    _fatal: str | None = None

    def observe(self, metrics: Mapping[str, float], step: int) -> tuple[list[HealthEvent], dict[str, float]]:
        """Update the history with one step; return new warnings and the `health/*` metrics of this step."""
        cfg = self.config
        if not cfg.enabled:
            return [], {}
        events: list[HealthEvent] = []
        out: dict[str, float] = {}
        self._watch_nonfinite(metrics, step, events, out)
        for key, value in [*metrics.items(), *self._derive(metrics).items()]:
            if _finite(value):
                self._history.setdefault(key, Series(cfg.window)).add(float(value))
        converged_now = False
        for name, check in MONITORS.items():
            result = check(self._history, cfg)
            if result is None:
                continue
            firing, value, message, converged = result
            out[f"health/{name}"] = 1.0 if firing else 0.0
            if converged:
                converged_now = True
                if name not in self._informed:  # information once per run: no reminder when it flickers
                    self._informed.add(name)
                    events.append(HealthEvent(step, name, converged, value, level="info"))
            if not firing:
                self._last_warned.pop(name, None)  # quiet again: the next firing warns at once
                continue
            self.counts[name] = self.counts.get(name, 0) + 1
            last = self._last_warned.get(name)
            if last is None or step - last >= cfg.repeat_every:
                self._last_warned[name] = step
                events.append(HealthEvent(step, name, message, value))
        if LEVEL_KEY in self._history:
            out["health/converged"] = 1.0 if converged_now else 0.0
        events += self._doctor_events(metrics, step)
        return events, out

    def _doctor_events(self, metrics: Mapping[str, float], step: int) -> list[HealthEvent]:
        """The doctor's findings on the run so far (``doctor``, every `doctor_every` steps), each warned
        once: one set of checks for `grpokit doctor` and the live run (doctor_live.py)."""
        if self.doctor is None:
            return []
        return [
            HealthEvent(
                step,
                f"doctor/{f.code}",
                f"{f.title}: {f.evidence}; try: {f.advice}",
                f.score,
                level="info" if f.level == "info" else "warning",
            )
            for f in self.doctor.add({"step": step, **metrics})
        ]

    def reading(self, name: str) -> Reading | None:
        """Monitor `name`'s verdict on the run observed so far (None while it lacks data)."""
        return MONITORS[name](self._history, self.config)

    def _watch_nonfinite(
        self, metrics: Mapping[str, float], step: int, events: list[HealthEvent], out: dict[str, float]
    ) -> None:
        """The non-finite monitor: count steps whose loss or gradient norm is NaN or inf in a row, warn
        on each, and mark the run fatal after ``max_nonfinite_steps`` of them."""
        cfg = self.config
        bad = nonfinite(metrics, cfg.nonfinite_keys)  # the doctor's rule too (nonfinite_checks.py)
        if bad:
            self.nonfinite_streak += 1
            out["health/nonfinite"] = 1.0
            values = ", ".join(f"{k}={float(metrics[k])}" for k in bad)
            events.append(
                HealthEvent(
                    step,
                    "nonfinite",
                    (
                        f"Non-finite {values}: this update was skipped ({self.nonfinite_streak} of at most "
                        f"{cfg.max_nonfinite_steps} in a row); if it repeats, lower the learning rate, enable gradient "
                        "clipping, or check the reward functions for NaN."
                    ),
                    float(self.nonfinite_streak),
                )
            )
            if self.nonfinite_streak >= cfg.max_nonfinite_steps:
                self._fatal = (
                    f"Training stopped at step {step}: {values} for {self.nonfinite_streak} steps in a row "
                    f"(health.max_nonfinite_steps={cfg.max_nonfinite_steps}); lower the learning rate, enable "
                    "gradient clipping, or train in bfloat16/float32 instead of float16."
                )
        elif any(k in metrics for k in cfg.nonfinite_keys):  # a row without them (an evaluation's) ends no streak
            self.nonfinite_streak = 0
            out["health/nonfinite"] = 0.0

    def _derive(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """This step's zeroed reward share, reward level and unsolved fractions (`solved_signatures`)."""
        zeroed = zeroed_share(metrics, batch_items(self.run_config))
        return ({ZEROED_KEY: zeroed} if zeroed is not None else {}) | self._derive_solved(metrics)

    def _derive_solved(self, metrics: Mapping[str, float]) -> dict[str, float]:
        if not all(_finite(metrics.get(k)) for k in SOLVED_KEYS[:2]):  # the step's best and worst reward
            return {}
        top, bottom = float(metrics["completions/reward_max"]), float(metrics["completions/reward_min"])
        self._best, self._floor = max(self._best, top), min(self._floor, bottom)
        if self._best - self._floor <= SAME_REWARD:  # no completion has ever scored differently: nothing is solved
            return {}
        derived = {}
        early = self._history[LEVEL_KEY].early if LEVEL_KEY in self._history else []
        if _finite(metrics.get("reward")):
            derived[LEVEL_KEY] = level = reward_level(float(metrics["reward"]), self._floor, self._best)
            early = early + [level] if len(early) < self.config.window else early  # this step's level is early too
        learned = not solved_from_start(early, self.config)  # solved from the first steps is no success
        solved_of = {
            "completions/frac_groups_same_text": "completions/frac_groups_same_text_solved",
            "frac_reward_zero_std": "completions/frac_groups_solved",
        }
        for key, solved in solved_of.items():
            if _finite(metrics.get(key)) and _finite(metrics.get(solved)):
                # this step's groups are "solved" only if its best is the run's best (an all-wrong batch is not)
                # solved groups without signal are waste in a run solved from the start (solved groups of one
                # text are no collapse, learned or not: same_text stays quiet, without claiming convergence)
                derived[UNSOLVED_KEYS[key]] = unsolved_share(
                    float(metrics[key]),
                    float(metrics[solved]),
                    top,
                    self._best,
                    self._floor,
                    learned or key != "frac_reward_zero_std",
                )
        return derived

    @property
    def firing(self) -> set[str]:
        """Names of the monitors that fired on the latest step (nonfinite included)."""
        names = set(self._last_warned)
        return names | ({"nonfinite"} if self.nonfinite_streak else set())

    def raise_if_fatal(self) -> None:
        """Raise TrainingHealthError if training cannot continue (too many non-finite steps in a row)."""
        if self._fatal is not None:
            raise TrainingHealthError(self._fatal)
