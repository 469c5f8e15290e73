"""What the doctor (record/doctor.py) reports, and the thresholds only it has.

A ``Finding`` is one diagnosis with its evidence and one change to try; ``DoctorConfig`` holds the
thresholds of the checks the health monitors (health.py) do not have.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One diagnosis: a stable `code`, a one-line `title`, the `evidence`, the `advice`; `score` ranks
    findings (0..1) and `severity` (1 = look at it, 2 = likely hurting, 3 = the run is not learning)."""

    code: str
    title: str
    evidence: str
    advice: str
    score: float

    @property
    def severity(self) -> int:
        return 3 if self.score >= 0.8 else 2 if self.score >= 0.5 else 1


@dataclass(frozen=True)
class DoctorConfig:
    """Thresholds of the checks the health monitors do not have."""

    heldout_min_gain: float = 0.02
    """Held-out accuracy must rise by more than this for a rising reward to count as real learning."""

    heldout_drop: float = 0.05
    """Flag a run whose held-out accuracy fell by more than this (reward not rising: else see above)."""

    truncated_max: float = 0.2
    """Flag when more than this fraction of recent completions hit the length limit."""

    zero_std_share: float = 0.5
    """Flag (milder than the health alarm) when this share of unsolved groups had no signal over the run."""

    grad_spike_ratio: float = 10.0
    """A gradient norm above this multiple of the run's median is a spike."""

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

    padding_share: float = 0.6
    """Flag when this share of the completion tokens a batch holds is padding (1 - mean / max length)."""
