"""The health section of the config: thresholds of the health monitors (record/health.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HealthConfig:
    """Thresholds of the health monitors. Defaults are loose on purpose: a warning should mean something."""

    enabled: bool = True
    """Run the monitors at all. Switching them off also disables the stop on repeated NaN losses."""

    warmup_steps: int = 10
    """No monitor fires before it has seen this many steps: early steps are noisy."""

    window: int = 10
    """Steps averaged into the "recent" value of a metric; also the length of the "early" window."""

    repeat_every: int = 50
    """A monitor that keeps firing repeats its warning at most once per this many steps."""

    entropy_min: float = 0.05
    """Mean per-token entropy (nats) below which the policy counts as collapsed."""

    entropy_drop_ratio: float = 0.2
    """Also a collapse when recent entropy falls below this fraction of its early value."""

    zero_std_max: float = 0.8
    """Fire when more than this fraction of groups have all-equal rewards (no learning signal), recently."""

    zero_std_run_max: float = 0.5
    """Also fire when, over the run so far, more than this fraction of groups had all-equal rewards without
    being solved: over half the rollouts paid for nothing, even if no recent window crossed `zero_std_max`."""

    length_growth_ratio: float = 1.5
    """Fire when recent mean completion length exceeds this multiple of the early one ..."""

    reward_flat_tol: float = 0.05
    """... while mean reward moved by less than this (absolute) between the same two windows."""

    kl_max: float = 1.0
    """Fire when the recent mean KL to the reference policy exceeds this."""

    clip_ratio_max: float = 0.3
    """Fire when the recent mean fraction of clipped tokens (clip_ratio/region_mean) exceeds this."""

    same_length_min_tokens: int = 16
    """Groups sharing a length shorter than this many tokens are not counted (short answers share lengths)."""
    same_length_max: float = 0.5
    """Fire when more than this fraction of groups have completions that all share one length."""

    same_text_max: float = 0.3
    """Fire when more than this fraction of groups have completions that are all the same text."""

    converged_reward_level: float = 0.85
    """Low entropy counts as convergence, not collapse, when the recent mean reward is at least this far
    (0..1) from the lowest to the highest completion reward seen in the run (needs `solved_signatures`)."""

    reward_failure_max: float = 0.1
    """Fire when more than this fraction of reward items (completion x function) failed, recently."""

    max_nonfinite_steps: int = 3
    """Raise TrainingHealthError after this many consecutive steps with non-finite loss or grad norm."""

    nonfinite_keys: list[str] = field(default_factory=lambda: ["loss", "grad_norm"])
    """The metrics whose non-finite values mean the update had to be skipped."""

    doctor_every: int = 10
    """Every this many steps (every tenth of the run so far once that is longer), also run `grpokit
    doctor`'s checks on the run so far and warn once per new finding (those the monitors above do not
    already warn about); 0 turns this off."""

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "window", "repeat_every", "max_nonfinite_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"health.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.doctor_every, int) or isinstance(self.doctor_every, bool) or self.doctor_every < 0:
            raise ValueError(f"health.doctor_every must be 0 (off) or a positive integer, got {self.doctor_every!r}")
        for name in ("zero_std_max", "zero_std_run_max"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
                raise ValueError(f"health.{name} must be a fraction in [0, 1], got {value!r}")
        self.nonfinite_keys = list(self.nonfinite_keys)


LIVE_ONLY: tuple[str, ...] = ("repeat_every", "doctor_every")
"""The health fields only the live monitors read (record/health.py, record/recorder.py): with health.enabled=false
nothing reads them, so validation refuses one set away from its default. Every other threshold is also the
doctor's (report.html at the end, ``grpokit doctor``: the run's health section), and same_length_min_tokens feeds a
step metric, so those act with the monitors off (tests/config/test_health_unread.py checks the split against the
sources)."""
