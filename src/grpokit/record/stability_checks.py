"""The doctor's checks of stability and the machinery (record/doctor.py): a runaway policy (KL,
clipping), gradient spikes, sampler-trainer mismatch, failing reward functions and environments,
throughput. Each returns a ``Finding`` or None.
"""

from __future__ import annotations

import statistics

from grpokit.config.health import HealthConfig
from grpokit.rewards.calls import COMPLETION_KINDS

from .config_advice import clipping, fewer_iterations, joined, precision
from .findings import DoctorConfig, Finding
from .health_checks import batch_items, zeroed_share
from .rank_failures import job_failure
from .report_data import Run
from .run_series import config_value, last_step, live_alarm, recent, span_steps, total, trend_of, values


def check_runaway(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    # decided by the live alarms kl_runaway and clip_runaway (health_checks.MONITORS) on the whole run
    kl_on = live_alarm(run, "kl_runaway", ("kl",), hc)
    clip_on = live_alarm(run, "clip_runaway", ("clip_ratio/region_mean",), hc)
    kl = recent(run, "kl", hc) if kl_on and kl_on.firing else None
    clip = recent(run, "clip_ratio/region_mean", hc) if clip_on and clip_on.firing else None
    found = []
    if kl:
        found.append(f"kl {kl[0]:.3g} > {hc.kl_max:g} ({kl[1]})")
    if clip:
        found.append(f"clipped tokens {clip[0]:.0%} > {hc.clip_ratio_max:.0%} ({clip[1]})")
    if not found:
        return None
    return Finding(
        "kl_clip_runaway",
        "Updates run away from the " + ("reference" if kl else "trust region"),
        "; ".join(found),
        joined(
            f"lower the learning rate (optim.lr={config_value(run, 'optim.lr')})",
            fewer_iterations(run),
            "raise algo.beta",
            clipping(run),
        ),
        0.8,
    )


def check_run_failed(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """An error ended the run (summary.json's ``failed``, written by the trainer as it stopped; under torchrun the
    failing rank's own record, record/rank_failures.py): whatever its metrics show, it did not finish, and the
    sentence says why and, with several processes, on which rank."""
    failed = job_failure(run.summary, run.path)
    if not isinstance(failed, dict):
        return None
    return Finding(
        "run_failed",
        "The run stopped with an error",
        f"after step {failed.get('step', '?')} (the last one recorded)"
        + (f" on rank {failed['rank']}" if isinstance(failed.get("rank"), int) else "")
        + f": {failed.get('error', 'an error')}",
        f"fix what the error names, then {_again(run)}",
        0.95,
    )


def check_run_killed(run: Run) -> Finding | None:
    """The training process died without a record (record/run_status.py: run.lock names a process that is gone,
    or no process holds it while summary.json records no end): the run is not in progress, and the next
    thing to do is to resume it. Read from the folder by `examine` only: a live run is never this."""
    status = run.status
    if status.state != "died":
        return None
    return Finding(
        "run_killed",
        "The training process died without a record (killed? out of memory?)",
        f"the last step recorded is {last_step(run)} (metrics.jsonl); {status.why}",
        "look for why it died (the out-of-memory killer in `dmesg` or the job scheduler's log; a second Ctrl-C "
        f"ends a run at once), then {_again(run)}",
        0.7,
    )


def _again(run: Run) -> str:
    """How to go on after a run ended early: --resume from its last checkpoint, or start again without one."""
    saved = sorted(p.name for p in (run.path / "checkpoints").glob("step-*") if p.is_dir())
    return (
        f"continue with `grpokit train --resume {run.path}` (from its last checkpoint, {saved[-1]})"
        if saved
        else "start the run again (it wrote no checkpoint to resume from)"
    )


def check_grad_spikes(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """Gradient norms far above the run's median; the steps whose norm was NaN or inf are `nonfinite_updates`'
    (nonfinite_checks.py)."""
    # a step of several updates logs their mean as grad_norm and the largest as grad_norm/max: a spike is the max
    pts = values(run, "grad_norm/max") or values(run, "grad_norm")
    med = statistics.median(v for _, v in pts) if len(pts) >= 6 else 0.0  # a median of fewer is no baseline
    spikes = [(s, v) for s, v in pts if med > 0 and v > dc.grad_spike_ratio * med]
    if not spikes:
        return None
    ev = ", ".join(f"step {s}: {v:.3g}" for s, v in spikes[:5]) + (
        f" (+{len(spikes) - 5} more)" if len(spikes) > 5 else ""
    )
    return Finding(
        "grad_spikes",
        "Gradient norm spikes",
        f"gradient norm spikes over {dc.grad_spike_ratio:g}x the median {med:.3g}: {ev}",
        "read the samples of those steps; "
        + joined(f"lower optim.lr ({config_value(run, 'optim.lr')})", clipping(run), precision(run)),
        0.5,
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
    tis = config_value(run, "rollout.tis_cap", None)
    tis = (
        f"truncated importance sampling weights the loss already (rollout.tis_cap={tis:g})"
        if isinstance(tis, (int, float)) and tis > 0
        else "correct with truncated importance sampling (rollout.tis_cap)"
    )
    return Finding(
        "sampler_mismatch",
        "The sampler and the trainer disagree on token probabilities",
        "; ".join(f"{k} {r[0]:.3g} > {limit:g} ({r[1]})" for k, r, limit in high),
        f"match precision and kernels between rollout and training (model.dtype), {tis}{mask}, and check that "
        "weights are synced to the sampler every step",
        0.75,
    )


# What a reward function's items can be counted as (rewards/runner.py): `failures` got failure_value
# (`nonfinite`, `machine_failures` and the time-outs of calls cut at reward.timeout_s among them);
# `zeroed` scored 0 for what the completion itself caused, each also counted by kind (COMPLETION_KINDS).
FAULT_COUNTS = ("failures", "nonfinite", "machine_failures", "zeroed", *COMPLETION_KINDS)


def fault_counts(run: Run) -> dict[str, dict[str, float]]:
    """Per reward function with any fault, its totals over the run of FAULT_COUNTS, plus
    `zeroed_timeouts` / `failed_timeouts`: `timeouts` counts both the completions whose verification ran
    out of budget (zeroed) and calls cut at reward.timeout_s (failures); the zeroed ones are what
    `zeroed` holds beyond the other kinds (tampering, crashes and limits score 0 too)."""
    names = dict.fromkeys(
        k.split("/")[1]
        for r in run.metrics
        for k in r
        if k.startswith("rewards/") and k.count("/") == 2 and k.rsplit("/", 1)[1] in FAULT_COUNTS
    )
    out = {}
    for n in names:
        c = {x: total(run, f"rewards/{n}/{x}") for x in FAULT_COUNTS}
        if any(c.values()):
            other = c["tampering"] + c["crashes"] + c["limits"]
            c["zeroed_timeouts"] = min(c["timeouts"], max(0.0, c["zeroed"] - other))
            c["failed_timeouts"] = c["timeouts"] - c["zeroed_timeouts"]
            out[n] = c
    return out


def zeroed_fraction(run: Run) -> list[tuple[int, float]]:
    """Per step, the share of reward items scored 0 for the completion's own fault (health_checks.
    zeroed_share, as the live alarm reads it), [] when the run's config does not say the batch size."""
    items = batch_items(run.config)
    pts = [(r.get("step"), zeroed_share(r, items)) for r in run.metrics]
    return [(int(s), z) for s, z in pts if z is not None and isinstance(s, (int, float))]


def verifier_fault_rate(run: Run) -> tuple[list[tuple[int, float]], str]:
    """Per step, the verifier's own failure and time-out rate: failed items plus zeroed ones (the
    completions that stalled, crashed or tampered with it), with the series' name for evidence."""
    failed, zeroed = dict(values(run, "rewards/failed_fraction")), dict(zeroed_fraction(run))
    if not zeroed:
        return sorted(failed.items()), "rewards/failed_fraction"
    steps = sorted(set(failed) | set(zeroed))
    return [(s, failed.get(s, 0.0) + zeroed.get(s, 0.0)) for s in steps], "failed + zeroed reward items"


def _fault_evidence(per: dict[str, dict[str, float]]) -> str:
    parts = []
    for n, c in per.items():
        bits = []
        if c["failures"]:
            bits.append(
                f"{c['failures']:.0f} failures"
                + "".join(
                    f", {v:.0f} {what}"
                    for v, what in (
                        (c["failed_timeouts"], "of them time-outs"),
                        (c["nonfinite"], "non-finite"),
                        (c["machine_failures"], "the machine's (a worker that died or never began)"),
                    )
                    if v
                )
            )
        if c["zeroed"] or any(c[k] for k in ("tampering", "crashes", "limits")) or c["zeroed_timeouts"]:
            kinds = (
                ("zeroed_timeouts", "verification out of budget"),
                ("tampering", "tampering"),
                ("crashes", "crashes"),
                ("limits", "past a limit"),
            )
            bits.append(
                f"{c['zeroed']:.0f} scored 0 for their own fault ("
                + ", ".join(f"{c[k]:.0f} {what}" for k, what in kinds if c[k])
                + ")"
            )
        parts.append(f"{n}: " + "; ".join(bits))
    return "".join("; " + p for p in parts)


def _fault_advice(per: dict[str, dict[str, float]], run: Run, rising: bool) -> str:
    def some(k: str) -> bool:
        return any(c[k] for c in per.values())

    advice = [
        "completions time out the verifier and score 0: the policy writes answers it cannot check within "
        "its budget (huge numbers, deep nesting, power towers), possibly a reward hack; read the samples of "
        "those steps before raising the budget"
        if some("zeroed_timeouts")
        else "",
        "programs tamper with the sandbox's result channel: a reward hack, read them" if some("tampering") else "",
        "completions crash the verifier or pass its size limits (scored 0): read them"
        if some("crashes") or some("limits")
        else "",
        f"raise reward.timeout_s (now {config_value(run, 'reward.timeout_s')}) or make the slow verifier cheaper"
        if some("failed_timeouts")
        else "",
        "make the function return finite numbers (NaN/inf score as failures)" if some("nonfinite") else "",
        "machine failures are the machine's, not the function's: check memory and the worker count "
        "(reward.num_workers) for killed or slow-starting workers"
        if some("machine_failures")
        else "",
        "read the logged errors (the first few per function are in the log) and fix the function"
        if some("failures") and (some("failed_timeouts") or some("nonfinite") or not some("machine_failures"))
        else "",
        "read the samples of the failing steps for answers built to stall, crash or tamper with the verifier"
        if rising
        else "",
    ]
    return "; ".join(a for a in advice if a)


def _fault_title(per: dict[str, dict[str, float]], frac: list[float], rising: bool) -> str:
    if rising:
        return "The verifier fails or is stalled more and more as training goes on (is the policy breaking it?)"
    failed = any(c["failures"] for c in per.values()) or any(frac)
    if not failed:
        hack = any(c["tampering"] for c in per.values())
        return "Completions " + ("tamper with the sandbox" if hack else "stall or break the verifier") + " (scored 0)"
    return "Reward functions " + ("time out" if any(c["failed_timeouts"] for c in per.values()) else "fail")


def _failures_alarm(run: Run, hc: HealthConfig) -> bool:
    """The live `reward_failures` alarm's rule (recent failed + zeroed share) on the whole run."""
    alarm = live_alarm(run, "reward_failures", ("rewards/failed_fraction",), hc)
    return alarm is not None and alarm.firing


def check_reward_failures(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    frac = [v for _, v in values(run, "rewards/failed_fraction")]
    per = fault_counts(run)
    if not per and not any(frac):
        return None
    mean = statistics.fmean(frac) if frac else 0.0
    zeroed = [v for _, v in zeroed_fraction(run)]
    zmean = statistics.fmean(zeroed) if zeroed else 0.0
    rate, label = verifier_fault_rate(run)
    tr = trend_of(rate, hc)
    # a failure (or zeroed) rate that grows with training is the policy learning to break or stall the verifier
    rising = tr is not None and tr[1] - tr[0] > dc.failure_rise and tr[1] >= 2 * tr[0]
    zero_share = f"; {zmean:.1%} scored 0 for the completion's own fault" if zmean else ""
    return Finding(
        "verifier_failures_rising" if rising else "reward_failures",
        _fault_title(per, frac, rising),
        (f"{label} {tr[0]:.1%} -> {tr[1]:.1%} ({tr[2]}); " if rising and tr else "")
        + f"{mean:.1%} of reward items failed over the run{zero_share}"
        + _fault_evidence(per),
        _fault_advice(per, run, rising),
        0.85 if rising or _failures_alarm(run, hc) else 0.4,
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
    rewards_slow = step_t > 0 and reward_t / step_t > dc.reward_time_share and reward_t >= dc.reward_time_min_s
    if rewards_slow:
        found.append(f"reward functions took {reward_t / step_t:.0%} of step time ({reward_t:.1f} of {step_t:.1f} s)")
    if pad > dc.padding_share:
        found.append(f"{pad:.0%} of completion token slots are padding (mean length / max length over the run)")
    if not found:
        return None
    return Finding(
        "throughput",
        "Time lost to " + ("rewards" if rewards_slow else "padding"),
        "; ".join(found),
        _throughput_advice(run, rewards_slow, pad > dc.padding_share),
        0.35,
    )


def _throughput_advice(run: Run, rewards_slow: bool, padded: bool) -> str:
    """Worker processes and token-packed micro-batches, each advised only where the run is without them."""
    workers, packed = config_value(run, "reward.num_workers", None), config_value(run, "train.micro_batch_tokens", None)
    advice = []
    if rewards_slow:
        advice.append(
            f"make the reward functions cheaper (they run in reward.num_workers={workers} worker processes)"
            if isinstance(workers, int) and workers > 0
            else "run reward functions in worker processes (reward.num_workers) and make them cheaper"
        )
    if padded:
        advice.append(
            f"padding: micro-batches are packed by tokens already (train.micro_batch_tokens={packed}); what remains "
            "comes from completions of very different lengths"
            if isinstance(packed, int) and packed > 0
            else "against padding, pack micro-batches by tokens (train.micro_batch_tokens)"
        )
    return "; ".join(advice)
