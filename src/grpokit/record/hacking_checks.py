"""The doctor's reward-hacking monitors (record/doctor.py): ways a policy earns reward without
getting better at the task, each read from what the run logged.

- a shaping term (format, tags, length) rises while the accuracy term and held-out accuracy stay flat;
- every completion of a group has the same length (a length reward gamed into zero variance: filler
  up to the budget);
- completions repeat themselves (read from samples.jsonl: the share of repeated word 4-grams);
- two reward components move apart (one rises as another falls: the policy trades one for the other).

The verifier's failure rate rising with training is in stability_checks.check_reward_failures.
"""

from __future__ import annotations

import statistics

from grpokit.config.health import HealthConfig

from .findings import DoctorConfig, Finding
from .report_data import Run
from .run_series import heldout_gain, live_alarm, recent, span_steps, top_sample, trend


def components(run: Run, hc: HealthConfig) -> dict[str, tuple[float, float, str]]:
    """{reward function name: (early mean, recent mean, span)} of every `rewards/NAME/mean` with a trend."""
    keys = dict.fromkeys(k for r in run.metrics for k in r if k.startswith("rewards/") and k.endswith("/mean"))
    out = {k.split("/")[1]: trend(run, k, hc) for k in keys}
    return {k: t for k, t in out.items() if t is not None}


def _is_shaping(name: str, dc: DoctorConfig) -> bool:
    return any(w in name.lower() for w in dc.format_names)


def check_format_over_accuracy(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    comps, gain = components(run, hc), heldout_gain(run)
    shaping = {k: t for k, t in comps.items() if _is_shaping(k, dc)}
    accuracy = {k: t for k, t in comps.items() if not _is_shaping(k, dc)}
    rising = [k for k, t in shaping.items() if t[1] - t[0] > hc.reward_flat_tol]
    if not rising or (gain is not None and gain[0] > dc.heldout_min_gain):
        return None
    if not accuracy and gain is None:
        return None  # nothing measures accuracy: the shaping term may be the task
    if any(t[1] - t[0] > hc.reward_flat_tol / 2 for t in accuracy.values()):
        return None
    k, t = rising[0], shaping[rising[0]]
    flat = ", ".join(f"{a} {u[0]:.3g} -> {u[1]:.3g}" for a, u in accuracy.items())
    return Finding(
        "format_over_accuracy",
        f"The {k} reward rises while accuracy stays flat (the policy learns the format, not the task)",
        f"rewards/{k}/mean {t[0]:.3g} -> {t[1]:.3g} ({t[2]})"
        + (f" while {flat}" if flat else "")
        + (f"; {gain[1]}" if gain else "")
        + top_sample(run),
        f"lower the weight of {k} (reward.weights) or pay it only with a correct answer; make the accuracy "
        "reward reachable (easier prompts, partial credit)",
        0.85,
        panel="reward",
        steps=span_steps(t[2]),
    )


def check_same_length(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    # decided by the live alarm same_length (health_checks.MONITORS) on the whole run
    alarm = live_alarm(run, "same_length", ("completions/frac_groups_same_length",), hc)
    r = recent(run, "completions/frac_groups_same_length", hc)
    if alarm is None or not alarm.firing or r is None:
        return None
    ln = recent(run, "completions/mean_length", hc)
    return Finding(
        "same_length_groups",
        "Every completion of a group has the same length (filler up to a length budget?)",
        f"{r[0]:.0%} of groups have one length for all completions ({r[1]})"
        + (f", mean length {ln[0]:.4g} tokens" if ln else "")
        + top_sample(run),
        "a length-based reward is being gamed into zero variance: read the samples for filler, pay length "
        "only with a correct answer, or drop the length term (reward.weights)",
        0.8,
        panel="signal",
        steps=span_steps(r[1]),
    )


def repetition(text: str) -> float:
    """Share of a text's word 4-grams that repeat an earlier one (0: none, ->1: one phrase over and over)."""
    words = text.split()
    grams = [tuple(words[i : i + 4]) for i in range(len(words) - 3)]
    return 1 - len(set(grams)) / len(grams) if len(grams) >= 4 else 0.0


def _sampled_repetition(run: Run) -> list[tuple[int, float]]:
    """(step, mean repetition of that step's sampled completions), oldest first."""
    by_step: dict[int, list[float]] = {}
    for row in run.samples:
        if not isinstance(row.get("step"), (int, float)) or not isinstance(row.get("completions"), list):
            continue
        for c in row["completions"]:
            if isinstance(c, dict) and isinstance(c.get("text"), str):
                by_step.setdefault(int(row["step"]), []).append(repetition(c["text"]))
    return sorted((s, statistics.fmean(v)) for s, v in by_step.items())


def check_repetition(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    pts = _sampled_repetition(run)
    if len(pts) < 2:
        return None
    (s0, first), (s1, last) = pts[0], pts[-1]
    if last <= dc.repetition_max or last - first < 0.2:
        return None
    return Finding(
        "repetition",
        "Completions repeat themselves more and more",
        f"{last:.0%} of the word 4-grams of step {s1}'s sampled completions repeat an earlier one "
        f"(step {s0}: {first:.0%})" + top_sample(run),
        "the reward pays for length or for a phrase: add a repetition or overlong penalty, pay length only "
        "with a correct answer, or lower optim.lr",
        0.75,
        panel="length",
        steps=(s0, s1),
    )


def check_components_diverge(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    comps = components(run, hc)
    up = {k: t for k, t in comps.items() if t[1] - t[0] > dc.diverge_min}
    down = {k: t for k, t in comps.items() if t[0] - t[1] > dc.diverge_min}
    if not up or not down:
        return None
    (ku, tu), (kd, td) = (
        max(up.items(), key=lambda kv: kv[1][1] - kv[1][0]),
        min(down.items(), key=lambda kv: kv[1][1] - kv[1][0]),
    )
    return Finding(
        "reward_components_diverge",
        f"Reward components move apart: {ku} rises while {kd} falls",
        f"rewards/{ku}/mean {tu[0]:.3g} -> {tu[1]:.3g}, rewards/{kd}/mean {td[0]:.3g} -> {td[1]:.3g} ({tu[2]})"
        + top_sample(run),
        f"the policy trades {kd} for {ku}: lower {ku}'s weight (reward.weights) or make it conditional on {kd}",
        0.75,
        panel="reward",
        steps=span_steps(tu[2]),
    )


__all__ = [
    "check_components_diverge",
    "check_format_over_accuracy",
    "check_repetition",
    "check_same_length",
    "repetition",
]
