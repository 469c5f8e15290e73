"""The doctor's checks of learning (record/doctor.py): reward against held-out accuracy (reward
hacking), one reward component rising alone, length growth, entropy collapse, groups without
signal, truncated completions. Each returns a ``Finding`` or None.
"""

from __future__ import annotations

import statistics

from grpokit.config.health import HealthConfig

from .config_advice import dynamic_sampling, masks_truncated
from .findings import DoctorConfig, Finding
from .health_checks import reward_level
from .report_data import Run
from .run_series import (
    config_value,
    heldout_fall,
    heldout_gain,
    live_alarm,
    recent,
    reward_span,
    top_sample,
    trend,
    unsolved_zero_std,
    window,
)


def check_heldout(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    tr, gain, fall = trend(run, "reward", hc), heldout_gain(run), heldout_fall(run)
    if tr is None or gain is None or tr[1] - tr[0] <= hc.reward_flat_tol:
        return None
    fell = fall is not None and fall[0] > dc.heldout_peak_drop  # it rose, then the policy unlearned it
    if gain[0] > dc.heldout_min_gain and not fell:
        return None
    return Finding(
        "reward_hacking_heldout",
        "Reward rises but held-out accuracy " + ("falls from its best" if fell else "does not") + " (reward hacking?)",
        f"reward {tr[0]:.3g} -> {tr[1]:.3g} ({tr[2]}) while {(fall if fell else gain)[1]}" + top_sample(run),
        "read the latest samples for a shortcut the reward pays for; make the verifier stricter "
        "(exact answer parsing, format checks) and evaluate held-out prompts more often (train.eval_every)",
        0.95,
    )


def check_heldout_drop(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    tr, gain, fall = trend(run, "reward", hc), heldout_gain(run), heldout_fall(run)
    if gain is None or (tr is not None and tr[1] - tr[0] > hc.reward_flat_tol):
        return None
    below = gain[0] < -dc.heldout_drop  # below the baseline
    fell = fall is not None and fall[0] > dc.heldout_peak_drop  # or far below its own best
    if not below and not fell:
        return None
    what = f"; reward {tr[0]:.3g} -> {tr[1]:.3g} ({tr[2]})" if tr else ""
    return Finding(
        "heldout_drop",
        "The policy got worse on held-out prompts",
        (gain if below else fall)[1] + what,
        f"lower the learning rate (optim.lr={config_value(run, 'optim.lr')}) and keep the policy near the reference "
        "(algo.beta > 0, fewer algo.num_iterations); compare with the checkpoint before the drop",
        0.9,
    )


def check_component_alone(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    comps = {
        k: trend(run, k, hc) for r in run.metrics[:1] for k in r if k.startswith("rewards/") and k.endswith("/mean")
    }
    comps = {k: t for k, t in comps.items() if t is not None}
    gain = heldout_gain(run)
    if len(comps) < 2 or (gain is not None and gain[0] > dc.heldout_min_gain):
        return None
    rising = [k for k, t in comps.items() if t[1] - t[0] > hc.reward_flat_tol]
    if len(rising) != 1 or any(t[1] - t[0] > hc.reward_flat_tol / 2 for k, t in comps.items() if k != rising[0]):
        return None
    k, t = rising[0], comps[rising[0]]
    others = ", ".join(f"{o} {u[0]:.3g} -> {u[1]:.3g}" for o, u in comps.items() if o != k)
    return Finding(
        "reward_component_alone",
        f"Only one reward component rises: {k}",
        f"{k} {t[0]:.3g} -> {t[1]:.3g} ({t[2]}) while {others}" + (f"; {gain[1]}" if gain else "") + top_sample(run),
        "the policy may be optimising the easiest term: lower its weight (reward.weights), "
        "or make the main reward reachable (easier prompts, partial credit)",
        0.7,
    )


def check_length(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """Completions grow without reward gain (the live `length_inflation` alarm's rule), or grow with the
    reward while no held-out gain shows that the longer answers pay (the doctor's own: it reads held-out)."""
    ln, rw, gain = trend(run, "completions/mean_length", hc), trend(run, "reward", hc), heldout_gain(run)
    alarm = live_alarm(run, "length_inflation", ("completions/mean_length",), hc)
    if ln is None or rw is None:
        return None
    evidence = f"mean length {ln[0]:.4g} -> {ln[1]:.4g} tokens ({ln[2]}), reward {rw[0]:.3g} -> {rw[1]:.3g}" + (
        f"; {gain[1]}" if gain else ""
    )
    advice = (
        "check samples for padding or repetition the reward pays for; add an overlong / length penalty "
        "(DAPO), or use a constant normaliser (algo.aggregation, Dr. GRPO)"
    )
    if alarm is not None and alarm.firing:
        return Finding(
            "length_growth", "Completions grow without reward gain", evidence + top_sample(run), advice, 0.75
        )
    grew = ln[0] > 0 and ln[1] >= hc.length_growth_ratio * ln[0]
    if not grew or rw[1] - rw[0] <= hc.reward_flat_tol or (gain is not None and gain[0] > dc.heldout_min_gain):
        return None
    return Finding(
        "length_with_reward",
        "Completions grow with the reward, and no held-out gain shows that longer answers pay",
        evidence + top_sample(run),
        advice + "; evaluate held-out prompts (train.eval_every) to tell longer reasoning from padding",
        0.6,
    )


def _reward_level(run: Run, recent: float) -> float | None:
    """Where the recent reward sits between the run's lowest and highest completion rewards (0..1)."""
    lo, hi = reward_span(run) or (0.0, 0.0)
    return reward_level(recent, lo, hi)  # the live monitors' rule (health_checks.py)


def check_entropy(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """The live `entropy_collapse` alarm's rule on the whole run (converged runs are not collapses)."""
    alarm = live_alarm(run, "entropy_collapse", ("entropy",), hc)
    if alarm is None or not alarm.firing:
        return None
    tr, rw = trend(run, "entropy", hc), recent(run, "reward", hc)
    level = _reward_level(run, rw[0]) if rw else None
    at = f", reward at {level:.0%} of its range" if level is not None else ""
    first = tr[0] if tr else alarm.value
    span = f" ({tr[2]})" if tr else ""
    if first < hc.entropy_min:  # never high: sampling was near-greedy from the first step, not a collapse
        return Finding(
            "entropy_collapse",
            "Entropy is near zero from the first steps: the samples barely differ",
            f"entropy {first:.3g} -> {alarm.value:.3g} nats{span}, below health.entropy_min {hc.entropy_min:g} "
            "from the start" + at,
            f"raise rollout.temperature (now {config_value(run, 'rollout.temperature')}) so a group's completions "
            "differ and some score better than others",
            0.85,
        )
    return Finding(
        "entropy_collapse",
        "Entropy collapsed before the task was learned",
        f"entropy {first:.3g} -> {alarm.value:.3g} nats{span}" + at,
        f"lower the learning rate (optim.lr={config_value(run, 'optim.lr')}), raise rollout.temperature, "
        "use clip-higher (algo.clip_high=0.28, DAPO) or an entropy bonus (algo.entropy_coef)",
        0.85,
    )


def check_zero_std(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """The live `zero_std_groups` alarm's rule on the whole run (recently above `zero_std_max`, or over the
    run above `zero_std_run_max`): solved groups are success, not waste (only in a run whose reward varies)."""
    alarm = live_alarm(run, "zero_std_groups", ("frac_reward_zero_std",), hc)
    unsolved = unsolved_zero_std(run, hc)
    if alarm is None or not alarm.firing or not unsolved:
        return None
    w = window(len(unsolved), hc)
    lately, overall = statistics.fmean(v for _, v in unsolved[-w:]), statistics.fmean(v for _, v in unsolved)
    return Finding(
        "zero_std_groups",
        "Many groups give no learning signal (all completions scored alike)",
        f"unsolved zero-std groups: {overall:.0%} of groups over the run, {lately:.0%} in steps "
        f"{unsolved[-w][0]}-{unsolved[-1][0]}",
        f"{dynamic_sampling(run)}, or a larger group (rollout.group_size={config_value(run, 'rollout.group_size')} "
        "-> more), or prompts of the right difficulty",
        0.9 if lately > hc.zero_std_max else 0.55,  # lately, or only over the run (`zero_std_run_max`)
    )


def check_truncation(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """Many completions cut at the length limit. With algo.mask_truncated on, they are also left out of the loss:
    above half of them, most of each batch teaches nothing (an error), and the mask is named as the cause, not
    advised."""
    r = recent(run, "completions/clipped_ratio", hc)
    if r is None or r[0] <= dc.truncated_max:
        return None
    limit = f"raise rollout.max_new_tokens (now {config_value(run, 'rollout.max_new_tokens')})"
    masked = masks_truncated(run)
    if masked:
        return Finding(
            "truncated",
            "Many completions are cut at the length limit and masked out of the loss",
            f"{r[0]:.0%} of completions truncated ({r[1]}); algo.mask_truncated=true leaves them out of the loss, "
            "so they teach nothing (a step whose every completion was cut has no gradient at all)",
            f"{limit} so completions finish, or set algo.mask_truncated=false and shape overlong answers instead "
            "(a soft overlong penalty, DAPO)",
            0.85 if r[0] > 0.5 else 0.7,
        )
    return Finding(
        "truncated",
        "Many completions are cut at the length limit",
        f"{r[0]:.0%} of completions truncated ({r[1]})",
        f"{limit}, or shape overlong answers (a soft overlong penalty, DAPO) / mask truncated ones "
        f"(algo.mask_truncated=true{'' if masked is False else ', if they are not masked already'})",
        0.7,
    )
