"""Health monitors: notice the classic ways a GRPO run goes wrong, and say what to try.

A GRPO run can look busy while learning nothing. The failures below are common enough to watch for
on every step; each monitor reads the step's metrics dict (the same one the sinks receive), decides
whether its failure is present, and if so produces one sentence saying what is wrong and what to try.

    monitor          reads                                     fires when (recent = mean of last `window` steps)
    entropy_collapse entropy, reward                           recent < entropy_drop_ratio x early, or recent <
                                                               entropy_min while the reward no longer rises (recent
                                                               window < reward_flat_tol above the one before)
    zero_std_groups  frac_reward_zero_std                      recent > zero_std_max
    length_inflation completions/mean_length, reward           length grew x length_growth_ratio, reward flat
    kl_runaway       kl                                        recent > kl_max
    clip_runaway     clip_ratio/region_mean                    recent > clip_ratio_max
    same_length      completions/frac_groups_same_length       recent > same_length_max
    same_text        completions/frac_groups_same_text         recent > same_text_max
    reward_failures  rewards/failed_fraction                   recent > reward_failure_max (no warmup)
    nonfinite        loss, grad_norm                           non-finite; fatal after max_nonfinite_steps in a row

Convergence is not a failure. Three signals are also what a run that has learned its task looks like:
identical completions and all-equal rewards in a group once its prompt is solved, and low entropy once
accuracy nears 100%. When the trainer adds `solved_signatures` (per-group rewards) to its metrics, those
monitors discount solved groups (every completion earns the run's best reward) and read the reward
level (recent mean reward placed between the lowest and highest completion reward seen in the run);
when what remains is below the threshold, or the level is at least `converged_reward_level`, the
monitor reports "converged" once as information (level "info", `health/converged` 1.0) instead of
warning. Without those metrics they warn.

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
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from grpokit.config.health import HealthConfig

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


class _Series:
    """Running view of one metric: how many finite values, the first `window` and the last two
    `window`s (the recent one and the one before it)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.count = 0
        self.early: list[float] = []
        self.last: deque[float] = deque(maxlen=2 * window)

    def add(self, value: float) -> None:
        self.count += 1
        if len(self.early) < self.window:
            self.early.append(value)
        self.last.append(value)

    def early_mean(self) -> float:
        return sum(self.early) / len(self.early)

    def recent_mean(self) -> float:
        recent = list(self.last)[-self.window :]
        return sum(recent) / len(recent)

    def previous_mean(self) -> float | None:
        """Mean of the `window` values before the recent window (None until there are that many)."""
        if len(self.last) < 2 * self.window:
            return None
        return sum(list(self.last)[: self.window]) / self.window


History = Mapping[str, _Series]


class Reading(NamedTuple):
    """A monitor's verdict on one step: firing (a warning), or `converged` (information), or quiet."""

    firing: bool
    value: float
    message: str  # the warning (used when firing)
    converged: str = ""  # the information, when the signal is what a converged run looks like


# A check returns None when it lacks data, else a Reading.
Check = Callable[[History, HealthConfig], "Reading | None"]
SOLVED_KEYS = (
    "completions/reward_max",
    "completions/reward_min",
    "completions/frac_groups_solved",
    "completions/frac_groups_same_text_solved",
)
_LEVEL = "health/reward_level"  # derived by HealthMonitor per step; see observe
_UNSOLVED = {
    "completions/frac_groups_same_text": "health/same_text_unsolved",
    "frac_reward_zero_std": "health/zero_std_unsolved",
}


def _level(key: str, cfg: HealthConfig, h: History) -> float | None:
    s = h.get(key)
    return s.recent_mean() if s is not None and s.count >= cfg.warmup_steps else None


def _trend(key: str, cfg: HealthConfig, h: History) -> tuple[float, float] | None:
    s = h.get(key)
    if s is None or s.count < max(cfg.warmup_steps, 2 * cfg.window):
        return None
    return s.early_mean(), s.recent_mean()


def check_entropy(h: History, cfg: HealthConfig) -> Reading | None:
    now = _level("entropy", cfg, h)
    if now is None:
        return None
    trend = _trend("entropy", cfg, h)
    early = trend[0] if trend else math.nan
    # Below the absolute floor while the reward is still climbing is the policy sharpening onto
    # answers that pay (a small task whose entropy starts near the floor, learning to call its tool):
    # that alone is no alarm until the reward stops rising, i.e. until the recent window's mean reward
    # is less than reward_flat_tol above the window before it. A fall below entropy_drop_ratio x early
    # is a collapse whatever the reward does.
    reward = h.get("reward")
    before = reward.previous_mean() if reward is not None else None
    rising = before is not None and reward.recent_mean() - before >= cfg.reward_flat_tol
    firing = (now < cfg.entropy_min and not rising) or (trend is not None and now < cfg.entropy_drop_ratio * early)
    level = _level(_LEVEL, cfg, h)
    converged = firing and level is not None and level >= cfg.converged_reward_level
    return Reading(
        firing and not converged,
        now,
        (
            f"Entropy per token fell to {now:.3g} (early value {early:.3g}): the policy is collapsing onto a few "
            "answers and will stop exploring; try a lower learning rate, a higher sampling temperature, "
            "a larger upper clip epsilon (DAPO clip-higher) or an entropy bonus."
        ),
        f"Converged: entropy per token fell to {now:.3g} (early value {early:.3g}) with the reward at "
        f"{level:.0%} of its range, as expected once the task is learned; if accuracy on held-out data still "
        "improves, nothing to do."
        if converged
        else "",
    )


def _solved_aware(key: str, max_value: float, cfg: HealthConfig, h: History, warn: str, info: str) -> Reading | None:
    """Fire on `key` > max_value unless, with solved groups discounted, what remains is below it."""
    now = _level(key, cfg, h)
    if now is None:
        return None
    unsolved = _level(_UNSOLVED[key], cfg, h)
    converged = now > max_value and unsolved is not None and unsolved <= max_value
    return Reading(
        now > max_value and not converged,
        now,
        warn.format(now=now),
        info.format(now=now, solved=now - (unsolved or 0.0)) if converged else "",
    )


def check_zero_std(h: History, cfg: HealthConfig) -> Reading | None:
    return _solved_aware(
        "frac_reward_zero_std",
        cfg.zero_std_max,
        cfg,
        h,
        (
            "{now:.0%} of groups give every completion the same reward, so their advantages are zero and they "
            "teach nothing: the prompts are too easy or too hard for the model; filter them with dynamic "
            "sampling (DAPO), use a curriculum, or sample more completions per prompt."
        ),
        (
            "Converged: {now:.0%} of groups give every completion the same reward, {solved:.0%} because every "
            "completion earns the best reward; the training prompts are solved, so more steps teach little "
            "(harder prompts or dynamic sampling would)."
        ),
    )


def check_length(h: History, cfg: HealthConfig) -> Reading | None:
    length, reward = _trend("completions/mean_length", cfg, h), _trend("reward", cfg, h)
    if length is None or reward is None:
        return None
    grew = length[1] > cfg.length_growth_ratio * length[0]
    flat = abs(reward[1] - reward[0]) < cfg.reward_flat_tol
    return Reading(
        grew and flat,
        length[1],
        (
            f"Mean completion length grew from {length[0]:.0f} to {length[1]:.0f} tokens while reward stayed flat "
            f"({reward[0]:.3g} -> {reward[1]:.3g}): the model is padding its answers; try a length or overlong "
            "penalty (DAPO) or a constant loss normaliser (Dr. GRPO) instead of per-sequence normalisation."
        ),
    )


def check_kl(h: History, cfg: HealthConfig) -> Reading | None:
    now = _level("kl", cfg, h)
    if now is None:
        return None
    return Reading(
        now > cfg.kl_max,
        now,
        (
            f"KL to the reference policy is {now:.3g}, above kl_max={cfg.kl_max:g}: the policy is drifting far "
            "from where it started; lower the learning rate, raise the KL coefficient beta, or clip gradients harder."
        ),
    )


def check_clip(h: History, cfg: HealthConfig) -> Reading | None:
    now = _level("clip_ratio/region_mean", cfg, h)
    if now is None:
        return None
    return Reading(
        now > cfg.clip_ratio_max,
        now,
        (
            f"{now:.0%} of tokens hit the clip range: updates are too large for the trust region; lower the "
            "learning rate, take fewer updates per batch, or check that sampling and training logprobs agree."
        ),
    )


def check_same_length(h: History, cfg: HealthConfig) -> Reading | None:
    now = _level("completions/frac_groups_same_length", cfg, h)
    if now is None:
        return None
    return Reading(
        now > cfg.same_length_max,
        now,
        (
            f"In {now:.0%} of groups every completion has the same length, a reward-hacking or collapse "
            "signature; read samples.jsonl and look for a shortcut in the reward functions (if they all hit "
            "the length limit, pass finish_reasons to group_signatures or raise max_new_tokens)."
        ),
    )


def check_same_text(h: History, cfg: HealthConfig) -> Reading | None:
    return _solved_aware(
        "completions/frac_groups_same_text",
        cfg.same_text_max,
        cfg,
        h,
        (
            "In {now:.0%} of groups all completions are the identical text: the policy has collapsed to one "
            "answer per prompt; raise the sampling temperature, lower the learning rate, and check samples.jsonl "
            "for a reward shortcut."
        ),
        (
            "Converged: in {now:.0%} of groups all completions are the identical text, {solved:.0%} of groups "
            "identical and earning the best reward: the policy answers solved prompts one way, as expected."
        ),
    )


def check_reward_failures(h: History, cfg: HealthConfig) -> Reading | None:
    s = h.get("rewards/failed_fraction")
    if s is None or not s.count:  # no warmup: failing rewards are not early noise of learning
        return None
    now = s.recent_mean()
    return Reading(
        now > cfg.reward_failure_max,
        now,
        (
            f"{now:.0%} of reward items failed recently (exceptions, timeouts, NaN or infinite values) and got "
            "failure_value instead of a score; read the logged errors, fix the reward function or raise "
            "reward.timeout_s."
        ),
    )


MONITORS: dict[str, Check] = {
    "entropy_collapse": check_entropy,
    "zero_std_groups": check_zero_std,
    "length_inflation": check_length,
    "kl_runaway": check_kl,
    "clip_runaway": check_clip,
    "same_length": check_same_length,
    "same_text": check_same_text,
    "reward_failures": check_reward_failures,
}
"""The trend and level monitors by name; `nonfinite` is handled by HealthMonitor itself."""


@dataclass
class HealthMonitor:
    """Feeds each step's metrics to every monitor; remembers which fire and how many NaN steps in a row.

    Use: `events, health_metrics = monitor.observe(metrics, step)` then `monitor.raise_if_fatal()`.
    The Recorder does exactly this in `log`, so a trainer using a Recorder need not call it.
    """

    config: HealthConfig = field(default_factory=HealthConfig)
    nonfinite_streak: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    _history: dict[str, _Series] = field(default_factory=dict)
    _last_warned: dict[str, int] = field(default_factory=dict)
    _informed: set[str] = field(default_factory=set)
    _best: float = -math.inf  # highest completion reward seen in the run
    _floor: float = math.inf  # lowest completion reward seen in the run
    _fatal: str | None = None

    def observe(self, metrics: Mapping[str, float], step: int) -> tuple[list[HealthEvent], dict[str, float]]:
        """Update the history with one step; return new warnings and the `health/*` metrics of this step."""
        cfg = self.config
        if not cfg.enabled:
            return [], {}
        events: list[HealthEvent] = []
        out: dict[str, float] = {}
        bad = [k for k in cfg.nonfinite_keys if k in metrics and not _finite(metrics[k])]
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
        else:
            self.nonfinite_streak = 0
            if any(k in metrics for k in cfg.nonfinite_keys):
                out["health/nonfinite"] = 0.0
        for key, value in [*metrics.items(), *self._derive(metrics).items()]:
            if _finite(value):
                self._history.setdefault(key, _Series(cfg.window)).add(float(value))
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
        if _LEVEL in self._history:
            out["health/converged"] = 1.0 if converged_now else 0.0
        return events, out

    def _derive(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """This step's reward level and unsolved fractions, from the `solved_signatures` metrics."""
        if not all(_finite(metrics.get(k)) for k in SOLVED_KEYS):
            return {}
        top, bottom = float(metrics["completions/reward_max"]), float(metrics["completions/reward_min"])
        self._best, self._floor = max(self._best, top), min(self._floor, bottom)
        span = self._best - self._floor
        if span <= 1e-6:  # no completion has ever scored differently: nothing counts as solved
            return {}
        # this step's best is "solved" only if it is the run's best: a batch that is all wrong is not solved
        at_best = top >= self._best - 1e-6 * max(1.0, abs(self._best))
        derived = {}
        if _finite(metrics.get("reward")):
            derived[_LEVEL] = (float(metrics["reward"]) - self._floor) / span
        solved_of = {
            "completions/frac_groups_same_text": "completions/frac_groups_same_text_solved",
            "frac_reward_zero_std": "completions/frac_groups_solved",
        }
        for key, solved in solved_of.items():
            if _finite(metrics.get(key)):
                derived[_UNSOLVED[key]] = max(0.0, float(metrics[key]) - (float(metrics[solved]) if at_best else 0.0))
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


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
