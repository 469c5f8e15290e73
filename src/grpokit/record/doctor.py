"""`grpokit doctor RUN`: read a finished (or running) run and say what looks wrong, why, and what to try.

The health monitors (health.py) watch a run step by step and warn early; the doctor reads the whole
run afterwards (config.yaml, metrics.jsonl, summary.json; samples.jsonl for the best recent sample that
the reward-hacking findings quote) and answers the questions users ask about a GRPO run that went
wrong. Each check is a small function of the run's metrics (and config) that returns a `Finding` with
its evidence (steps and numbers) and one concrete change to try, or None. Findings are ranked by `score` (how likely the
problem cost the run its learning), highest first.

Thresholds the health monitors already have (entropy floor and drop ratio, zero-std share, length
growth, KL and clip limits, reward-failure share, the converged reward level, the window, the
non-finite keys) are read
from the run's own `health` config section, so the doctor and the live alarms agree; only what the
monitors do not watch has a threshold here (`DoctorConfig`).

"early" is the mean of a metric's first `window` values, "recent" of its last `window`, with the
window shrunk to a third of the run for short runs; trend checks need at least 6 values.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from grpokit.config.health import HealthConfig

from .report_data import Run


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


def _vals(run: Run, key: str) -> list[tuple[int, float]]:
    return [
        (int(r["step"]), float(r[key]))
        for r in run.metrics
        if isinstance(r.get(key), (int, float))
        and not isinstance(r.get(key), bool)
        and isinstance(r.get("step"), (int, float))
        and math.isfinite(r[key])
    ]


def _window(n: int, hc: HealthConfig) -> int:
    return max(2, min(hc.window, n // 3))


def _trend(run: Run, key: str, hc: HealthConfig) -> tuple[float, float, str] | None:
    """(early mean, recent mean, "steps a-b vs c-d") of a metric, or None with fewer than 6 values."""
    pts = _vals(run, key)
    if len(pts) < 6:
        return None
    w = _window(len(pts), hc)
    early, recent = pts[:w], pts[-w:]
    span = f"steps {early[0][0]}-{early[-1][0]} vs {recent[0][0]}-{recent[-1][0]}"
    return statistics.fmean(v for _, v in early), statistics.fmean(v for _, v in recent), span


def _recent(run: Run, key: str, hc: HealthConfig) -> tuple[float, str] | None:
    pts = _vals(run, key)
    if len(pts) < min(hc.warmup_steps, 3) or not pts:
        return None
    last = pts[-_window(len(pts), hc) :]
    return statistics.fmean(v for _, v in last), f"steps {last[0][0]}-{last[-1][0]}"


def _heldout_gain(run: Run) -> tuple[float, str] | None:
    """Held-out accuracy change over the run: eval/accuracy's first and last values, else summary.json."""
    pts = _vals(run, "eval/accuracy")
    if len(pts) >= 2:
        return pts[-1][1] - pts[0][
            1
        ], f"eval/accuracy {pts[0][1]:.3g} (step {pts[0][0]}) -> {pts[-1][1]:.3g} (step {pts[-1][0]})"
    acc = [
        run.summary.get(k, {}).get("accuracy") if isinstance(run.summary.get(k), dict) else None
        for k in ("eval_before", "eval_after")
    ]
    if all(isinstance(a, (int, float)) for a in acc):
        return acc[1] - acc[0], f"held-out accuracy {acc[0]:.3g} before -> {acc[1]:.3g} after training"
    return None


def _cfg(run: Run, dotted: str, default: Any = "?") -> Any:
    node: Any = run.config
    for part in dotted.split("."):
        node = node.get(part, default) if isinstance(node, dict) else default
    return node


def _top_sample(run: Run) -> str:
    """The best-rewarded completion of the last sampled step, to read for a shortcut ("" without samples)."""
    rows = [
        r for r in run.samples if isinstance(r.get("completions"), list) and isinstance(r.get("step"), (int, float))
    ]
    if not rows:
        return ""
    last = max(r["step"] for r in rows)
    comps = [
        c
        for r in rows
        if r["step"] == last
        for c in r["completions"]
        if isinstance(c, dict) and isinstance(c.get("reward"), (int, float)) and math.isfinite(c["reward"])
    ]
    if not comps:
        return ""
    best = max(comps, key=lambda c: c["reward"])
    text = " ".join(str(best.get("text", "")).split())
    return f'; best sample of step {int(last)} (reward {best["reward"]:.3g}): "{text[:120]}{"..." if len(text) > 120 else ""}"'


def check_heldout(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    tr, gain = _trend(run, "reward", hc), _heldout_gain(run)
    if tr is None or gain is None or tr[1] - tr[0] <= hc.reward_flat_tol or gain[0] > dc.heldout_min_gain:
        return None
    return Finding(
        "reward_hacking_heldout",
        "Reward rises but held-out accuracy does not (reward hacking?)",
        f"reward {tr[0]:.3g} -> {tr[1]:.3g} ({tr[2]}) while {gain[1]}" + _top_sample(run),
        "read the latest samples for a shortcut the reward pays for; make the verifier stricter "
        "(exact answer parsing, format checks) and evaluate held-out prompts more often (train.eval_every)",
        0.95,
    )


def check_heldout_drop(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    tr, gain = _trend(run, "reward", hc), _heldout_gain(run)
    if gain is None or gain[0] >= -dc.heldout_drop or (tr is not None and tr[1] - tr[0] > hc.reward_flat_tol):
        return None
    what = f"; reward {tr[0]:.3g} -> {tr[1]:.3g} ({tr[2]})" if tr else ""
    return Finding(
        "heldout_drop",
        "The policy got worse on held-out prompts",
        gain[1] + what,
        f"lower the learning rate (optim.lr={_cfg(run, 'optim.lr')}) and keep the policy near the reference "
        "(algo.beta > 0, fewer algo.num_iterations); compare with the checkpoint before the drop",
        0.9,
    )


def check_component_alone(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    comps = {
        k: _trend(run, k, hc) for r in run.metrics[:1] for k in r if k.startswith("rewards/") and k.endswith("/mean")
    }
    comps = {k: t for k, t in comps.items() if t is not None}
    gain = _heldout_gain(run)
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
        f"{k} {t[0]:.3g} -> {t[1]:.3g} ({t[2]}) while {others}" + (f"; {gain[1]}" if gain else "") + _top_sample(run),
        "the policy may be optimising the easiest term: lower its weight (reward.weights), "
        "or make the main reward reachable (easier prompts, partial credit)",
        0.7,
    )


def check_length(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    ln, rw, gain = _trend(run, "completions/mean_length", hc), _trend(run, "reward", hc), _heldout_gain(run)
    if (
        ln is None
        or ln[0] <= 0
        or ln[1] < hc.length_growth_ratio * ln[0]
        or (gain is not None and gain[0] > dc.heldout_min_gain)
    ):
        return None
    up = rw is not None and rw[1] - rw[0] > hc.reward_flat_tol
    what = f"reward {rw[0]:.3g} -> {rw[1]:.3g}" if rw else "no reward recorded"
    return Finding(
        "length_growth",
        "Completions grow " + ("with the reward" if up else "without reward gain"),
        f"mean length {ln[0]:.4g} -> {ln[1]:.4g} tokens ({ln[2]}), {what}"
        + (f"; {gain[1]}" if gain else "")
        + _top_sample(run),
        "check samples for padding or repetition the reward pays for; add an overlong / length penalty "
        "(DAPO), or use a constant normaliser (algo.aggregation, Dr. GRPO)",
        0.75 if not up else 0.6,
    )


def _reward_level(run: Run, recent: float) -> float | None:
    """Where the recent reward sits between the run's lowest and highest completion rewards (0..1)."""
    lows = [v for _, v in _vals(run, "completions/reward_min")] or [v for _, v in _vals(run, "reward")]
    highs = [v for _, v in _vals(run, "completions/reward_max")] or [v for _, v in _vals(run, "reward")]
    lo, hi = (min(lows), max(highs)) if lows and highs else (0.0, 0.0)
    return (recent - lo) / (hi - lo) if hi > lo else None


def check_entropy(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    tr, rw = _trend(run, "entropy", hc), _recent(run, "reward", hc)
    if tr is None or not (tr[1] < hc.entropy_drop_ratio * tr[0] or tr[1] < hc.entropy_min):
        return None
    level = _reward_level(run, rw[0]) if rw else None
    if level is not None and level >= hc.converged_reward_level:  # a solved task: low entropy is convergence
        return None
    return Finding(
        "entropy_collapse",
        "Entropy collapsed before the task was learned",
        f"entropy {tr[0]:.3g} -> {tr[1]:.3g} nats ({tr[2]})"
        + (f", reward at {level:.0%} of its range" if level is not None else ""),
        f"lower the learning rate (optim.lr={_cfg(run, 'optim.lr')}), raise rollout.temperature, "
        "use clip-higher (algo.clip_high=0.28, DAPO) or an entropy bonus (algo.entropy_coef)",
        0.85,
    )


def check_zero_std(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    pts = _vals(run, "frac_reward_zero_std")
    if len(pts) < 3:
        return None
    solved = dict(_vals(run, "completions/frac_groups_solved"))
    unsolved = [(s, max(0.0, v - solved.get(s, 0.0))) for s, v in pts]  # solved groups: success, not waste
    w = _window(len(pts), hc)
    recent, overall = statistics.fmean(v for _, v in unsolved[-w:]), statistics.fmean(v for _, v in unsolved)
    if recent <= hc.zero_std_max and overall <= dc.zero_std_share:
        return None
    return Finding(
        "zero_std_groups",
        "Many groups give no learning signal (all completions scored alike)",
        f"unsolved zero-std groups: {overall:.0%} of groups over the run, {recent:.0%} in steps "
        f"{unsolved[-w][0]}-{unsolved[-1][0]}",
        f"use dynamic sampling (algo.dynamic_sampling=true, DAPO) or a larger group "
        f"(rollout.group_size={_cfg(run, 'rollout.group_size')} -> more), or prompts of the right difficulty",
        0.9 if recent > hc.zero_std_max else 0.55,
    )


def check_truncation(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    r = _recent(run, "completions/clipped_ratio", hc)
    if r is None or r[0] <= dc.truncated_max:
        return None
    return Finding(
        "truncated",
        "Many completions are cut at the length limit",
        f"{r[0]:.0%} of completions truncated ({r[1]})",
        f"raise rollout.max_new_tokens (now {_cfg(run, 'rollout.max_new_tokens')}), or shape overlong "
        "answers (a soft overlong penalty, DAPO) / mask truncated ones (algo.mask_truncated=true)",
        0.7,
    )


def check_runaway(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    kl, clip = _recent(run, "kl", hc), _recent(run, "clip_ratio/region_mean", hc)
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
        f"lower the learning rate (optim.lr={_cfg(run, 'optim.lr')}), fewer updates per batch "
        f"(algo.num_iterations={_cfg(run, 'algo.num_iterations')}), raise algo.beta, clip gradients "
        "harder (optim.max_grad_norm)",
        0.8,
    )


def check_grad_spikes(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    pts = _vals(run, "grad_norm")
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
        f"read the samples of those steps; lower optim.lr ({_cfg(run, 'optim.lr')}), keep gradient clipping on "
        f"(optim.max_grad_norm={_cfg(run, 'optim.max_grad_norm')}), prefer bf16 over fp16",
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
        if (r := _recent(run, k, hc)) and r[0] > getattr(dc, field)
    ]
    if not high:
        return None
    # IcePop masking is advised only to runs whose grpokit has it (their config lists the field)
    mask = (
        " or mask the disagreeing tokens (rollout.mismatch_mask=token, IcePop)"
        if _cfg(run, "rollout.mismatch_mask", None) is not None
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


def _total(run: Run, key: str) -> float:
    return sum(v for _, v in _vals(run, key))


def check_reward_failures(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    frac = [v for _, v in _vals(run, "rewards/failed_fraction")]
    kinds = ("failures", "timeouts", "nonfinite")
    names = dict.fromkeys(
        k.split("/")[1]
        for r in run.metrics
        for k in r
        if k.startswith("rewards/") and k.endswith(tuple("/" + x for x in kinds))
    )
    per = {n: [_total(run, f"rewards/{n}/{x}") for x in kinds] for n in names}
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
    return Finding(
        "reward_failures",
        "Reward functions " + ("time out" if timed_out else "fail"),
        f"{mean:.1%} of reward items failed over the run" + counts,
        (
            f"raise reward.timeout_s (now {_cfg(run, 'reward.timeout_s')}) or make the slow verifier cheaper; "
            if timed_out
            else ""
        )
        + ("make the function return finite numbers (NaN/inf score as failures); " if nonfinite else "")
        + "read the logged errors (the first few per function are in the log) and fix the function",
        0.85 if mean > hc.reward_failure_max else 0.4,
    )


def check_env_failures(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    resets = [(s, v) for s, v in _vals(run, "episodes/reset_failures") if v > 0]
    slow = [s for s, v in _vals(run, "episodes/tool_timeouts_mean") if v > 0]
    fail = _recent(run, "tools/failure_frequency", hc)
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
        f"env.reset_timeout_s (now {_cfg(run, 'env.reset_timeout_s')}) and env.tool_timeout_s "
        f"(now {_cfg(run, 'env.tool_timeout_s')}) for slow tools",
        0.7 if resets else 0.45,
    )


def check_throughput(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    reward_t, step_t = sum(v for _, v in _vals(run, "time/reward")), sum(v for _, v in _vals(run, "time/step"))
    ln, mx = _vals(run, "completions/mean_length"), _vals(run, "completions/max_length")
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


CHECKS: tuple[Callable[[Run, HealthConfig, DoctorConfig], Finding | None], ...] = (
    check_heldout,
    check_heldout_drop,
    check_component_alone,
    check_length,
    check_entropy,
    check_zero_std,
    check_truncation,
    check_runaway,
    check_grad_spikes,
    check_mismatch,
    check_reward_failures,
    check_env_failures,
    check_throughput,
)


def health_config(run: Run) -> HealthConfig:
    """The run's own health thresholds (its config's `health` section), defaults for the rest."""
    section = run.config.get("health") if isinstance(run.config.get("health"), dict) else {}
    names = {f.name for f in fields(HealthConfig)}
    try:
        return HealthConfig(**{k: v for k, v in section.items() if k in names})
    except (TypeError, ValueError):
        return HealthConfig()


def diagnose(run: Run, dc: DoctorConfig = DoctorConfig()) -> list[Finding]:
    """Every finding for `run`, most important first."""
    hc = health_config(run)
    return sorted((f for check in CHECKS if (f := check(run, hc, dc)) is not None), key=lambda f: -f.score)


def format_findings(findings: Sequence[Finding], name: str) -> str:
    if not findings:
        return f"grpokit doctor: {name}: nothing to fix found."
    lines = [f"grpokit doctor: {name}: {len(findings)} finding(s), most important first"]
    for i, f in enumerate(findings, 1):
        lines += [f"{i}. [{f.code}] {f.title}", f"   evidence: {f.evidence}", f"   try: {f.advice}"]
    return "\n".join(lines)
