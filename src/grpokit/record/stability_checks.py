"""The doctor's checks of stability and the machinery (record/doctor.py): a runaway policy (KL,
clipping), gradient spikes, sampler-trainer mismatch, failing reward functions and environments,
throughput. Each returns a ``Finding`` or None.
"""

from __future__ import annotations

import math
import statistics

from grpokit.config.health import HealthConfig

from .findings import DoctorConfig, Finding
from .report_data import Run
from .run_series import config_value, recent, span_steps, total, trend, values


def check_runaway(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    kl, clip = recent(run, "kl", hc), recent(run, "clip_ratio/region_mean", hc)
    found = []
    if kl and kl[0] > hc.kl_max:
        found.append(f"kl {kl[0]:.3g} > {hc.kl_max:g} ({kl[1]})")
    if clip and clip[0] > hc.clip_ratio_max:
        found.append(f"clipped tokens {clip[0]:.0%} > {hc.clip_ratio_max:.0%} ({clip[1]})")
    if not found:
        return None
    return Finding(
        "kl_clip_runaway",
        "Updates run away from the " + ("reference" if kl and kl[0] > hc.kl_max else "trust region"),
        "; ".join(found),
        f"lower the learning rate (optim.lr={config_value(run, 'optim.lr')}), fewer updates per batch "
        f"(algo.num_iterations={config_value(run, 'algo.num_iterations')}), raise algo.beta, clip gradients "
        "harder (optim.max_grad_norm)",
        0.8,
    )


def check_grad_spikes(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    pts = values(run, "grad_norm")
    if len(pts) < 6:
        return None
    med = statistics.median(v for _, v in pts)
    spikes = [(s, v) for s, v in pts if med > 0 and v > dc.grad_spike_ratio * med]
    bad = [
        int(r["step"])
        for r in run.metrics
        for k in hc.nonfinite_keys  # the keys the live NaN alarm reads
        if isinstance(r.get(k), float) and not math.isfinite(r[k]) and isinstance(r.get("step"), (int, float))
    ]
    if not spikes and not bad:
        return None
    ev = ", ".join(f"step {s}: {v:.3g}" for s, v in spikes[:5]) + (
        f" (+{len(spikes) - 5} more)" if len(spikes) > 5 else ""
    )
    ev = f"gradient norm spikes over {dc.grad_spike_ratio:g}x the median {med:.3g}: {ev}" if spikes else ""
    ev += (
        (("; " if ev else "") + f"non-finite {' or '.join(hc.nonfinite_keys)} at steps {sorted(set(bad))[:8]}")
        if bad
        else ""
    )
    return Finding(
        "grad_spikes",
        "Gradient norm spikes" + (" and non-finite steps" if bad else ""),
        ev,
        f"read the samples of those steps; lower optim.lr ({config_value(run, 'optim.lr')}), keep gradient clipping on "
        f"(optim.max_grad_norm={config_value(run, 'optim.max_grad_norm')}), prefer bf16 over fp16",
        0.65 if bad else 0.5,
    )


# The sampler/trainer gaps the doctor judges, with the DoctorConfig field of each one's limit. Left out on
# purpose: mismatch/logp_abs_diff_max (the single worst token of a step is large even in healthy runs) and
# mismatch/masked_fraction (what a chosen correction removed, the consequence of outside_fraction).
MISMATCH_LIMITS = {
    "mismatch/logp_abs_diff_mean": "mismatch_max",
    "tis/logp_abs_diff_mean": "mismatch_max",
    "mismatch/k3_kl": "mismatch_kl_max",
    "mismatch/outside_fraction": "mismatch_outside_max",
}


def check_mismatch(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    high = [
        (k, r, getattr(dc, field))
        for k, field in MISMATCH_LIMITS.items()
        if (r := recent(run, k, hc)) and r[0] > getattr(dc, field)
    ]
    if not high:
        return None
    # IcePop masking is advised only to runs whose grpokit has it (their config lists the field)
    mask = (
        " or mask the disagreeing tokens (rollout.mismatch_mask=token, IcePop)"
        if config_value(run, "rollout.mismatch_mask", None) is not None
        else ""
    )
    return Finding(
        "sampler_mismatch",
        "The sampler and the trainer disagree on token probabilities",
        "; ".join(f"{k} {r[0]:.3g} > {limit:g} ({r[1]})" for k, r, limit in high),
        "match precision and kernels between rollout and training (model.dtype), correct with truncated "
        f"importance sampling (rollout.tis_cap){mask}, and check that weights are synced to the sampler "
        "every step",
        0.75,
    )


def check_reward_failures(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    frac = [v for _, v in values(run, "rewards/failed_fraction")]
    kinds = ("failures", "timeouts", "nonfinite")
    names = dict.fromkeys(
        k.split("/")[1]
        for r in run.metrics
        for k in r
        if k.startswith("rewards/") and k.endswith(tuple("/" + x for x in kinds))
    )
    per = {n: [total(run, f"rewards/{n}/{x}") for x in kinds] for n in names}
    per = {n: c for n, c in per.items() if any(c)}
    if not per and not any(frac):
        return None
    mean = statistics.fmean(frac) if frac else 0.0
    # `failures` counts every failed item, time-outs and non-finite values among them (rewards/runner.py)
    counts = "".join(
        f"; {n}: {max(c):.0f} failures"
        + "".join(f", {v:.0f} {what}" for v, what in zip(c[1:], ("of them time-outs", "non-finite")) if v)
        for n, c in per.items()
    )
    timed_out, nonfinite = any(c[1] for c in per.values()), any(c[2] for c in per.values())
    tr = trend(run, "rewards/failed_fraction", hc)
    # a failure rate that grows with training is the policy learning to break (or stall) the verifier
    rising = tr is not None and tr[1] - tr[0] > dc.failure_rise and tr[1] >= 2 * tr[0]
    return Finding(
        "verifier_failures_rising" if rising else "reward_failures",
        ("The verifier fails more and more as training goes on (is the policy breaking it?)" if rising else "")
        or "Reward functions " + ("time out" if timed_out else "fail"),
        (f"rewards/failed_fraction {tr[0]:.1%} -> {tr[1]:.1%} ({tr[2]}); " if rising and tr else "")
        + f"{mean:.1%} of reward items failed over the run"
        + counts,
        (
            f"raise reward.timeout_s (now {config_value(run, 'reward.timeout_s')}) or make the slow verifier cheaper; "
            if timed_out
            else ""
        )
        + ("make the function return finite numbers (NaN/inf score as failures); " if nonfinite else "")
        + "read the logged errors (the first few per function are in the log) and fix the function"
        + (
            "; read the samples of the failing steps for answers built to stall or crash the verifier" if rising else ""
        ),
        0.85 if mean > hc.reward_failure_max or rising else 0.4,
        panel="faults",
        steps=span_steps(tr[2]) if rising and tr else None,
    )


def check_env_failures(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    resets = [(s, v) for s, v in values(run, "episodes/reset_failures") if v > 0]
    slow = [s for s, v in values(run, "episodes/tool_timeouts_mean") if v > 0]
    fail = recent(run, "tools/failure_frequency", hc)
    found = []
    if resets:
        found.append(
            f"{sum(v for _, v in resets):.0f} episodes lost to a failed reset() (steps {resets[0][0]}-{resets[-1][0]})"
        )
    if slow:
        found.append(f"tool calls ran past env.tool_timeout_s at {len(slow)} steps (first: step {slow[0]})")
    if fail and fail[0] > dc.tool_failure_max:
        found.append(f"{fail[0]:.0%} of tool calls failed ({fail[1]})")
    if not found:
        return None
    return Finding(
        "env_failures",
        "Tools or environments fail",
        "; ".join(found),
        "read the tool turns of the samples for the errors; fix the environment's reset() or raise "
        f"env.reset_timeout_s (now {config_value(run, 'env.reset_timeout_s')}) and env.tool_timeout_s "
        f"(now {config_value(run, 'env.tool_timeout_s')}) for slow tools",
        0.7 if resets else 0.45,
    )


def check_throughput(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    reward_t, step_t = sum(v for _, v in values(run, "time/reward")), sum(v for _, v in values(run, "time/step"))
    ln, mx = values(run, "completions/mean_length"), values(run, "completions/max_length")
    pad = 1 - sum(v for _, v in ln) / sum(v for _, v in mx) if ln and mx and sum(v for _, v in mx) > 0 else 0.0
    found = []
    if step_t > 0 and reward_t / step_t > dc.reward_time_share:
        found.append(f"reward functions took {reward_t / step_t:.0%} of step time ({reward_t:.1f} of {step_t:.1f} s)")
    if pad > dc.padding_share:
        found.append(f"{pad:.0%} of completion token slots are padding (mean length / max length over the run)")
    if not found:
        return None
    return Finding(
        "throughput",
        "Time lost to " + ("rewards" if step_t and reward_t / step_t > dc.reward_time_share else "padding"),
        "; ".join(found),
        "run reward functions in worker processes (reward.num_workers) and make them cheaper; "
        "against padding, pack micro-batches by tokens (train.micro_batch_tokens)",
        0.35,
    )
