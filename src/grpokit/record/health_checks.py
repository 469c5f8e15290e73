"""The health monitors' checks (record/health.py): each reads the history of the run's metrics and
returns a ``Reading`` (firing, converged or quiet), or None while it lacks data.

``MONITORS`` names them; ``HealthMonitor`` (health.py) feeds every step's metrics into the history
(``Series`` per metric) and turns readings into events. The table of what each reads and when it
fires is health.py's docstring.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from grpokit.config.health import HealthConfig


class Series:
    """Running view of one metric: how many finite values, the first `window` and the last two
    `window`s (the recent one and the one before it)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.count = 0
        self.total = 0.0
        self.early: list[float] = []
        self.last: deque[float] = deque(maxlen=2 * window)

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        if len(self.early) < self.window:
            self.early.append(value)
        self.last.append(value)

    def mean(self) -> float:
        """Mean of every value so far."""
        return self.total / self.count

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


History = Mapping[str, Series]


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
LEVEL_KEY = "health/reward_level"  # derived by HealthMonitor per step; see observe
UNSOLVED_KEYS = {
    "completions/frac_groups_same_text": "health/same_text_unsolved",
    "frac_reward_zero_std": "health/zero_std_unsolved",
}


# The rules below are the live monitors' and the doctor's both (one implementation): HealthMonitor
# applies them to the run so far, step by step (health.py); the doctor to the whole run (run_series.py,
# learning_checks.py, signal_checks.py), with the lowest and highest completion reward of the whole run.
def finite(value: object) -> bool:
    """A number that is neither NaN nor infinite (a value that is no number at all is not finite either)."""
    try:
        return math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def nonfinite(metrics: Mapping[str, object], keys: Sequence[str]) -> list[str]:
    """The `keys` present in `metrics` whose value is not finite: one step's reading of the live `nonfinite`
    monitor (HealthMonitor, on `health.nonfinite_keys`) and of the doctor's non-finite checks."""
    return [k for k in keys if k in metrics and not finite(metrics[k])]


SAME_REWARD = 1e-6  # a run whose completion rewards never differed by more than this has no "best"


def reward_level(reward: float, floor: float, best: float) -> float | None:
    """Where `reward` sits between the lowest and highest completion reward seen (0..1); None when no
    completion ever scored differently (an always-0 run is not "at its best")."""
    return (reward - floor) / (best - floor) if best - floor > SAME_REWARD else None


EARLY_OUTLIERS = 0.1
"""The share of the first `window` steps (rounded down: one of 10, none of fewer) that may sit off the level a
run is judged by from its first steps (`early_floor`): one batch of hard prompts does not make a learner."""


def early_floor(early: Sequence[float]) -> float:
    """The lowest of the first steps' values once `EARLY_OUTLIERS` of them (the lowest) are set aside: the min of
    fewer than 10, the second lowest of 10. A rule on it holds for every early step but an outlier, where a mean
    let a run that rose fast (levels 0.25, 0.625, 0.875, then 1: mean 0.875 over 10 steps) pass for one that
    started there."""
    return sorted(early)[int(EARLY_OUTLIERS * len(early))]


def solved_from_start(early_levels: Sequence[float], cfg: HealthConfig) -> bool:
    """Whether the reward sat at its best from the first steps: the reward level (`reward_level`) of every one of
    the run's first `window` steps, an outlier aside (`early_floor`), already at `converged_reward_level` or
    above. Such a run learned nothing: its groups were solved before any update (a verifier that accepts
    everything, prompts the model already solves), so its flat groups are waste and its low entropy no
    convergence; convergence is a run that started below that level and rose to it, however fast. False
    while no level is known."""
    return bool(early_levels) and early_floor(early_levels) >= cfg.converged_reward_level


def unsolved_share(frac: float, solved: float, top: float, best: float, floor: float, learned: bool = True) -> float:
    """Of a step's share `frac` of groups without signal (or of identical text), the part not solved:
    a group counts as solved (`solved`: the share of groups whose every completion earned the step's
    best) only when the step's best `top` is the best completion reward seen (`best`), some completion
    ever scored differently and the run `learned` (its reward did not sit at its best from the first
    steps: `solved_from_start`); in a run whose reward is always 0, or always at its best, every such
    group is waste."""
    if not learned or best - floor <= SAME_REWARD or top < best - SAME_REWARD * max(1.0, abs(best)):
        return frac
    return max(0.0, frac - solved)


def learned_so_far(h: History, cfg: HealthConfig) -> bool:
    """`solved_from_start`'s negation on the history: the first `window` reward levels (LEVEL_KEY) seen."""
    s = h.get(LEVEL_KEY)
    return not solved_from_start(s.early if s is not None else [], cfg)


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
    level = _level(LEVEL_KEY, cfg, h)
    converged = firing and level is not None and level >= cfg.converged_reward_level and learned_so_far(h, cfg)
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
    """Fire on `key` > max_value unless, with solved groups discounted, what remains is below it; that is
    convergence (the information) only in a run that learned (`learned_so_far`) and whose solved groups are
    at least half of those counted (a few solved groups that only bring the share under the limit are no
    convergence), else quiet."""
    now = _level(key, cfg, h)
    if now is None:
        return None
    unsolved = _level(UNSOLVED_KEYS[key], cfg, h)
    discounted = now > max_value and unsolved is not None and unsolved <= max_value
    converged = discounted and learned_so_far(h, cfg) and now - (unsolved or 0.0) >= now / 2
    return Reading(
        now > max_value and not discounted,
        now,
        warn.format(now=now),
        info.format(now=now, solved=now - (unsolved or 0.0)) if converged else "",
    )


def check_zero_std(h: History, cfg: HealthConfig) -> Reading | None:
    recent = _solved_aware(
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
    if recent is None or recent.firing:
        return recent
    # the run so far: over half its groups unsolved and without signal is waste, whatever the last window says
    s = h.get(UNSOLVED_KEYS["frac_reward_zero_std"]) or h.get("frac_reward_zero_std")
    if s is None or s.count < max(cfg.warmup_steps, cfg.window) or s.mean() <= cfg.zero_std_run_max:
        return recent
    return Reading(
        True,
        s.mean(),
        f"Over the run so far {s.mean():.0%} of groups gave every completion the same reward without being "
        "solved: most rollouts are paid for and teach nothing; filter them with dynamic sampling (DAPO), use a "
        "curriculum (data.curriculum=frontier) or sample more completions per prompt.",
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


def _above(key: str, limit_field: str, warn: str) -> Check:
    """A monitor that fires on the recent mean of `key` above the HealthConfig field `limit_field`;
    `warn` is formatted with the mean as `now` and the limit as `limit`."""

    def check(h: History, cfg: HealthConfig) -> Reading | None:
        now, limit = _level(key, cfg, h), getattr(cfg, limit_field)
        return None if now is None else Reading(now > limit, now, warn.format(now=now, limit=limit))

    return check


check_kl = _above(
    "kl",
    "kl_max",
    "KL to the reference policy is {now:.3g}, above kl_max={limit:g}: the policy is drifting far from where it "
    "started; lower the learning rate, raise the KL coefficient beta, or clip gradients harder.",
)
check_clip = _above(
    "clip_ratio/region_mean",
    "clip_ratio_max",
    "{now:.0%} of tokens hit the clip range: updates are too large for the trust region; lower the "
    "learning rate, take fewer updates per batch, or check that sampling and training logprobs agree.",
)
check_same_length = _above(
    "completions/frac_groups_same_length",
    "same_length_max",
    "In {now:.0%} of groups every completion has the same length, a reward-hacking or collapse "
    "signature; read samples.jsonl and look for a shortcut in the reward functions (if they all hit "
    "the length limit, pass finish_reasons to group_signatures or raise max_new_tokens).",
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


ZEROED_KEY = "health/zeroed_fraction"  # derived by HealthMonitor per step from rewards/*/zeroed; see zeroed_share


def batch_items(config: Mapping[str, object]) -> int | None:
    """Completions per step (train.prompts_per_step x rollout.group_size) from a run's resolved config,
    None when it does not say (a run read from TRL or TensorBoard files)."""
    train, rollout = config.get("train"), config.get("rollout")
    p = train.get("prompts_per_step") if isinstance(train, Mapping) else None
    g = rollout.get("group_size") if isinstance(rollout, Mapping) else None
    ok = all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (p, g))
    return p * g if ok else None  # type: ignore[operator]


def zeroed_share(row: Mapping[str, object], items: int | None) -> float | None:
    """The share of a step's reward items scored 0 for the completion's own fault (its verification out
    of budget, tampering, crashing the verifier, past a limit: rewards/runner.py's `zeroed`): the sum of
    `rewards/<name>/zeroed` over `items` completions x the functions that report it. None without them."""
    z = [v for k, v in row.items() if k.startswith("rewards/") and k.endswith("/zeroed") and k.count("/") == 2]
    scored = row.get("rewards/scored")  # every completion scored in the step: dynamic sampling's rounds, GFPO's extra
    if isinstance(scored, (int, float)) and math.isfinite(scored) and scored > 0:
        items = int(scored)
    if not items or not z or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in z):
        return None
    return sum(z) / (items * len(z))  # type: ignore[arg-type]


def check_reward_failures(h: History, cfg: HealthConfig) -> Reading | None:
    s = h.get("rewards/failed_fraction")
    if s is None or not s.count:  # no warmup: failing rewards are not early noise of learning
        return None
    zeroed = h.get(ZEROED_KEY)
    failed, zero = s.recent_mean(), zeroed.recent_mean() if zeroed is not None and zeroed.count else 0.0
    now = failed + zero
    return Reading(
        now > cfg.reward_failure_max,
        now,
        (
            f"{now:.0%} of reward items failed, or scored 0 for their own fault, recently "
            f"({failed:.0%} got failure_value: "
            "exceptions, calls cut at reward.timeout_s, NaN or infinite values, workers that died; "
            f"{zero:.0%} scored 0 for what the completion did: stalling, crashing or tampering with the "
            "verifier); read the logged errors and fix the function, raise reward.timeout_s only for slow "
            "calls, and read the zeroed completions' samples for a reward hack."
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
