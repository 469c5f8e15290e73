"""What the doctor (record/doctor.py) reports, and the thresholds only it has.

A ``Finding`` is one diagnosis with its evidence and one change to try; ``DoctorConfig`` holds the
thresholds of the checks the health monitors (health.py) do not have.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

LEVELS = ("info", "warning", "error")


@dataclass(frozen=True)
class Finding:
    """One diagnosis: a stable `code`, a one-line `title`, the `evidence`, the `advice`; `score` ranks
    findings (0..1) and `severity` (1 = look at it, 2 = likely hurting, 3 = the run is not learning).
    `panel` names the report's plot that shows the evidence (report_data.GROUPS ids) and `steps` the
    first and last step of it, so the report can link a finding to what the doctor saw."""

    code: str
    title: str
    evidence: str
    advice: str
    score: float
    panel: str = ""
    steps: tuple[int, int] | None = None

    @property
    def severity(self) -> int:
        return 3 if self.score >= 0.8 else 2 if self.score >= 0.5 else 1

    @property
    def level(self) -> str:
        """ "error" (the run is not learning, or learning the wrong thing), "warning" (worth a change)
        or "info" (a note: what could not be checked, how the run ended): `--fail-on` reads this."""
        return "error" if self.score >= 0.8 else "warning" if self.score >= 0.3 else "info"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"severity": self.severity, "level": self.level}


@dataclass(frozen=True)
class DoctorConfig:
    """Thresholds of the checks the health monitors do not have."""

    heldout_min_gain: float = 0.02
    """Held-out accuracy must rise by more than this for a rising reward to count as real learning."""

    heldout_drop: float = 0.05
    """Flag a run whose held-out accuracy fell by more than this (reward not rising: else see above)."""

    heldout_peak_drop: float = 0.1
    """Also flag a run whose latest held-out accuracy lies more than this below its best evaluation
    (a run that learned, then unlearned); twice heldout_drop, since one evaluation of 200 prompts
    already wanders by a few points."""

    truncated_max: float = 0.2
    """Flag when more than this fraction of recent completions hit the length limit."""

    zero_std_share: float = 0.5
    """Flag (milder than the health alarm) when this share of unsolved groups had no signal over the run."""

    grad_spike_ratio: float = 10.0
    """A gradient norm above this multiple of the run's median is a spike."""

    nonfinite_share: float = 0.1
    """A run whose update keys (health.nonfinite_keys), or another metric the checks read, were NaN or inf at
    this share of its logged steps (and at least health.max_nonfinite_steps of them) went bad, also where fewer
    than health.max_nonfinite_steps of them came in a row (`nonfinite_updates` or `nonfinite_metrics` is then an
    error)."""

    mismatch_max: float = 0.05
    """Flag when the mean |log pi_train - log pi_sampler| per token (`mismatch/logp_abs_diff_mean`,
    `tis/logp_abs_diff_mean`) averages above this recently."""

    mismatch_kl_max: float = 0.005
    """Flag when the sampler-to-trainer KL estimate (`mismatch/k3_kl`) averages above this recently
    (k3 is about half the mean squared log ratio: 0.005 is a typical |log ratio| of 0.1)."""

    mismatch_outside_max: float = 0.01
    """Flag when more than this fraction of tokens has a ratio outside [rollout.mismatch_low,
    rollout.mismatch_high] (`mismatch/outside_fraction`), recently."""

    tool_failure_max: float = 0.2
    """Flag when more than this fraction of tool calls failed (`tools/failure_frequency`), recently."""

    reward_time_share: float = 0.25
    """Flag when reward functions take more than this share of step time."""

    reward_time_min_s: float = 10.0
    """...and took at least this many seconds in all: a short run's few seconds of rewards are nothing to win,
    and their share there follows the machine's load (a 20-step demo's 0.9 s read 27% on a loaded machine, 5%
    on a quiet one)."""

    padding_share: float = 0.6
    """Flag when this share of the completion tokens a batch holds is padding (1 - mean / max length)."""

    reward_std_dead: float = 0.1
    """Flag when the recent within-group reward spread (`reward_std`) fell below this fraction of its
    early value while the reward is below health.converged_reward_level of its range."""

    constant_group_share: float = 0.9
    """A step counts as pinned when at least this share of its groups had every completion at the step's best
    reward (`completions/frac_groups_solved`) ..."""

    constant_step_share: float = 0.9
    """... and the reward counts as constant (`reward_constant`) when at least this share of the run's steps
    is pinned at one and the same best and the run was there from its first `health.window` steps: every one of
    them, an outlier aside (health_checks.early_floor), had a mean reward within 1 - health.converged_reward_level
    of that best (as a share of the run's completion reward range). A few outlier completions or steps do not
    hide a reward that never varied, and a run that rose to solve every group, however fast (convergence), is
    not one."""

    unscored_max: float = 0.1
    """Flag when more than this share of the completions got no reward at all (every reward function answered
    None for them: `rewards/unscored` over `rewards/scored`)."""

    zero_grad_share: float = 0.1
    """Flag when at least this share of steps (and 2 or more) had a gradient norm of exactly 0."""

    kl_pinned_tol: float = 0.001
    """KL values within this fraction of the run's highest KL count as pinned at that ceiling."""

    kl_pinned_clamp_share: float = 0.1
    """With algo.kl_clamp set, a recent mean KL within this fraction of the clamp counts as pinned at it."""

    clip_asymmetry_ratio: float = 5.0
    """Flag when one side's recent clip fraction is this many times the other's ..."""

    clip_asymmetry_min: float = 0.05
    """... and both sides together clip more than this fraction of tokens."""

    clip_eps_min: float = 0.05
    """A clip epsilon (algo.clip_low / clip_high) below this, with more than `clip_asymmetry_min` of
    tokens clipped recently, is a trust region too narrow to learn at the configured pace."""

    format_names: tuple[str, ...] = ("format", "tag", "style", "think", "length", "xml")
    """Reward functions whose name contains one of these count as shaping terms (format, length, style)
    for the check "a shaping term rises while accuracy stays flat"; the others count as accuracy."""

    repetition_max: float = 0.5
    """Flag when recent sampled completions repeat more than this share of their word 4-grams
    (1 - distinct / all), and at least 0.2 more than the run's first samples."""

    failure_rise: float = 0.05
    """Reward failures (rewards/failed_fraction) "rise with training" when their recent mean exceeds the
    early one by more than this (absolute) and at least doubles."""

    small_group_max: int = 3
    """Flag groups of at most this many completions when, over the run, at least `zero_std_share` of
    them had no signal."""

    diverge_min: float = 0.1
    """Two reward components diverge when one rises and another falls, each by more than this."""
