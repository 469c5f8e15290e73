"""How each of a step's metrics combines over data-parallel ranks: one declared rule per metric name.

Under torchrun every rank measures its own share of the step (P/K prompts, each group whole on one rank) and
rank 0 writes one line for the job. What a rank's value means decides how the K values combine, so every
metric grpokit logs has a rule in ``RULES`` (tests/record/test_rank_reduction.py checks the names grpokit's
sources write):

    same      the job's figure already, equal on every rank: computed from all-reduced sums (the update's
              loss, grad_norm, kl ...), over every rank's gathered rows (rewards/<f>/mean and /std,
              domain/<d>/*, the advantages); rank 0's is kept
    mean      a mean over this rank's rows when every rank has as many (completions, groups, episodes):
              the mean of the ranks' values is the job's mean
    sum       a count (failures, scored completions, reset failures): the job's is the sum
    min, max  the smallest / largest of the ranks' (lengths, a step's time: the slowest rank's)
    weighted  a rate whose denominator differs between ranks: the ranks' values weighted by ``by``, a count
              of the same rank (another metric, or a weight the trainer passes: ``tokens``, the rank's
              completion tokens)
    rate      a count per second: the ranks' ``by`` weights summed over the largest of the ranks' seconds
              ``over`` (the first of those metrics the line has): the job's tokens over its slowest rank's time

A stage that measures a statistic on its own rank's rows only (step-level credit, token statistics) says how
many values it covers beside it, ``weight/<key>`` (or ``weight/<prefix>`` for ``<prefix>/mean``, ``/std``,
``/min``, ``/max``); such a part combines exactly, whatever its rule, by ``pool`` (the ranks' counts
``n_r``):

    mean      M = sum_r n_r m_r / sum_r n_r                                 (a rate is a mean too)
    std       S = sqrt(sum_r n_r (s_r^2 + (m_r - M)^2) / sum_r n_r)        (population std, its ``mean`` beside it)
    min, max  over the parts that cover a value (an empty part's placeholder is left out)
    count     a name starting ``num_``: the sum

``weight/`` entries are never written (``reduce_metrics`` drops them with one process too); the loss's
``weight/<name>`` (algo/loss.py clip_metrics) is the same convention over micro-batches (train/update.py).

A name no rule covers (a reward function's own ``log_metric``) is the mean over the ranks that logged it, or
the min / max by its name (``extreme``, the one naming rule for extremes: ranks, micro-batches, updates). The
union of the ranks' keys is kept, so a metric one rank lacks cannot hang the job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase

from grpokit.algo.contexts import WEIGHT


@dataclass(frozen=True)
class Rule:
    """How one metric combines over ranks (see the module docstring)."""

    how: str
    """``same``, ``mean``, ``sum``, ``min``, ``max``, ``weighted`` or ``rate``."""
    by: str = ""
    """``weighted`` / ``rate``: the weight's name, a metric of the same rank or a weight the caller passes."""
    over: tuple[str, ...] = ()
    """``rate``: the seconds' metric names, the first one a line has (its max over ranks divides)."""


SAME, MEAN, SUM, MIN, MAX = Rule("same"), Rule("mean"), Rule("sum"), Rule("min"), Rule("max")
TOKENS = Rule("weighted", "tokens")

_COUNTS = ("failures", "nonfinite", "not_applicable", "zeroed", "timeouts", "tampering", "crashes", "limits")

RULES: tuple[tuple[str, Rule], ...] = (
    # counts
    *((f"rewards/*/{c}", SUM) for c in (*_COUNTS, "machine_failures")),
    ("rewards/scored", SUM),
    ("rewards/unscored", SUM),
    ("episodes/reset_failures", SUM),
    ("gec/corrected_groups", SUM),
    ("rollout/worker_faults", SUM),
    ("rollout/workers", SUM),
    # over every rank's rows (train/step_metrics.py); a stage's figure of its own rows comes with weight/ (pool)
    ("rewards/*/mean", SAME),
    ("rewards/*/std", SAME),
    ("domain/*", SAME),
    ("tokens_per_second", Rule("rate", "tokens", ("time/step",))),  # every rank's tokens / the slowest rank's time
    # the asynchronous sampler's own seconds on the batch, else the trainer's rollout span (train/step_metrics.py)
    ("rollout/tokens_per_second", Rule("rate", "tokens", ("time/sampling", "time/rollout"))),
    ("completions/*_terminated_length", SAME),
    ("num_tokens", SAME),
    ("advantages/*", SAME),
    ("frac_reward_zero_std", SAME),
    ("num_zero_std_groups", SAME),
    *((f"{stage}/*", SAME) for stage in ("gigpo", "gagpo", "gtpo", "grpo_s", "eda", "tis", "sampling", "distill")),
    ("mismatch/masked_fraction", SAME),
    ("dynamic_sampling/*", SAME),
    ("gfpo/hard_prompts", SAME),
    # the update: sums over every rank's tokens (train/update.py), or settings every rank shares
    *(
        (k, SAME)
        for k in ("loss", "policy_loss", "aux_loss", "grad_norm", "grad_norm/max", "learning_rate", "kl", "entropy")
    ),
    *((k, SAME) for k in ("entropy_coef", "ratio/mean", "skipped_nonfinite", "offpolicy/masked_sequences")),
    ("cispo_clip_ratio", SAME),
    ("train/shared_prefix_tokens_saved", SAME),
    ("clip_ratio/*_mean", SAME),
    ("mismatch/logp_abs_diff_max", MAX),
    ("mismatch/*", SAME),
    *((f"{state}/*", SAME) for state in ("entropy", "lambda_grpo", "vespo", "curriculum")),
    ("data/position", SAME),
    ("stage", SAME),
    ("stage/step", SAME),
    ("rollout/weight_sync_step", SAME),
    # the smallest / largest of the ranks'
    ("clip_ratio/low_min", MIN),
    ("clip_ratio/high_max", MAX),
    ("completions/min_length", MIN),
    ("completions/max_length", MAX),
    ("completions/reward_min", MIN),
    ("completions/reward_max", MAX),
    ("episodes/turns_max", MAX),
    ("rollout/staleness_max", MAX),
    ("rollout/weight_sync_bytes", MAX),
    ("time/*", MAX),  # the step waits for its slowest rank
    ("gpu/*", MAX),  # one device's peak
    # rates over a rank's own count
    ("tools/failure_frequency", Rule("weighted", "tools/call_frequency")),
    ("tools/truncated_frequency", Rule("weighted", "tools/call_frequency")),
    ("gec/injected_reward_mean", Rule("weighted", "gec/corrected_groups")),
    ("rollout/staleness", TOKENS),
    # means over as many rows on every rank
    ("reward", MEAN),
    ("reward_std", MEAN),  # the mean of the groups' stds, and every rank has P/K groups
    ("completions/mean_length", MEAN),
    ("completions/clipped_ratio", MEAN),
    ("completions/frac_groups_*", MEAN),  # solved: against the job's best reward (train/step_metrics.py)
    ("rewards/failed_fraction", MEAN),
    ("rewards/no_*_fraction", MEAN),  # the built-in rewards' log_metric: shares of the completions scored
    ("episodes/*", MEAN),
    ("tools/call_frequency", MEAN),
    ("sampled/*", MEAN),  # the runner's figures of every sampling round, as logged before dynamic sampling / GFPO
)


def rule_for(key: str) -> Rule | None:
    """The first rule of ``RULES`` whose pattern matches ``key`` (``*`` spans ``/`` too); None: none does."""
    return next((rule for pattern, rule in RULES if fnmatchcase(key, pattern)), None)


def extreme(key: str) -> str | None:
    """``"min"`` / ``"max"`` for a metric that is a smallest / largest value by its name (its last part ``min`` /
    ``max``, or ending ``_min`` / ``_max``), else None: the one rule every combination of a metric's values
    reads (over ranks here, over micro-batches and updates in train/update.py and train/step_metrics.py)."""
    leaf = key.rsplit("/", 1)[-1]
    return next((kind for kind in ("min", "max") if leaf == kind or leaf.endswith("_" + kind)), None)


def _fallback(key: str) -> Rule:
    return {"min": MIN, "max": MAX}.get(extreme(key) or "", MEAN)


def part_weight(metrics: dict, key: str) -> float | None:
    """How many values ``key`` covers on this rank (``weight/<key>``, else ``weight/<prefix>``); None: the key
    is no part (its rule combines it)."""
    prefix = key.rsplit("/", 1)[0]
    found = metrics.get(WEIGHT + key, metrics.get(WEIGHT + prefix) if prefix != key else None)
    return None if found is None else float(found)


def pool(key: str, parts: list[tuple[float, float]], means: list[float] | None = None) -> float:
    """The job's ``key`` from every rank's ``(count, value)`` part (see the module docstring); ``means``: for a
    std, each part's mean. A mean over no value at all is 0.0 (the stages' empty value), a min / max the first
    part's.

    Example, two ranks' advantages over 1 and 3 values: rank 0 {mean 2, std 0, max 2}, rank 1
    {mean 6, std 2, max 9}: M = (1*2 + 3*6) / 4 = 5; S^2 = (1*(0 + 9) + 3*(4 + 1)) / 4 = 6, S = 2.449; max 9."""
    counts, values = [n for n, _ in parts], [v for _, v in parts]
    total, kind = sum(counts), extreme(key)
    if key.rsplit("/", 1)[-1].startswith("num_"):
        return sum(values)
    if kind is not None:
        return _extreme_of([v for n, v in zip(counts, values) if n > 0] or values[:1], kind)
    if total <= 0:
        return 0.0
    if means is None:
        return _weighted_mean(parts)
    job_mean = sum(n * m for n, m in zip(counts, means)) / total  # each part's spread plus its mean's distance
    var = sum(n * (s * s + (m - job_mean) ** 2) for n, s, m in zip(counts, values, means)) / total
    return math.sqrt(max(var, 0.0))


def _weighted_mean(parts: list[tuple[float, float]]) -> float:
    """The mean of ``(count, value)`` parts, each weighing by its count; 0.0 over no count (the stages' empty value)."""
    total = sum(n for n, _ in parts)
    return sum(n * v for n, v in parts) / total if total > 0 else 0.0


def _extreme_of(values: list[float], kind: str) -> float:
    """The smallest / largest of ``values`` that are not NaN (a rank where none had one: clip_ratio/low_min);
    NaN when all are."""
    seen = [v for v in values if not math.isnan(v)] or values[:1]
    return max(seen) if kind == "max" else min(seen)


def _pooled(key: str, have: list[dict]) -> float:
    parts = [(part_weight(m, key) or 0.0, float(m[key])) for m in have]
    mean_key = key[: -len("std")] + "mean"
    stds = key.rsplit("/", 1)[-1] == "std" and all(isinstance(m.get(mean_key), (int, float)) for m in have)
    return pool(key, parts, [float(m[mean_key]) for m in have] if stds else None)


def _by_rule(rule: Rule, vals: list[float], have: list[tuple[dict, dict]], out: dict[str, float]) -> float:
    """One key's value over the ranks that have it, by its rule."""
    if rule.how == "same":
        return vals[0]
    if rule.how == "sum":
        return sum(vals)
    if rule.how in ("min", "max"):
        return _extreme_of(vals, rule.how)
    ws = [float(w.get(rule.by, m.get(rule.by, 0.0))) for m, w in have]
    if rule.how == "rate":  # every rank's count over the slowest rank's seconds
        over = next((k for k in rule.over if k in out), None)
        return sum(ws) / max(out[over] if over is not None else 0.0, 1e-9)
    if rule.how == "weighted":  # each rank a part of ws[r] values, pooled as a mean (rule.by names the count)
        return _weighted_mean(list(zip(ws, vals)))
    return sum(vals) / len(vals)


def combine(every: list[dict[str, float]], weights: list[dict[str, float]] | None = None) -> dict[str, float]:
    """One line of the job from every rank's metrics (rank order), each key by its rule, or pooled as a part
    (``weight/``, see the module docstring); ``weights``: per rank, the weights a ``weighted`` or ``rate`` rule
    may name beside the rank's metrics (``tokens``). Non-numbers and ``weight/`` entries are dropped.

    Example, two ranks: {"rewards/f/failures": 1, "completions/max_length": 5, "reward": 0.5} and
    {"rewards/f/failures": 2, "completions/max_length": 7, "reward": 1.0} -> failures 3 (a count),
    max_length 7, reward 0.75 (each rank's mean over as many completions)."""
    weights = weights or [{} for _ in every]
    out: dict[str, float] = {}
    keys = list(dict.fromkeys(k for m in every for k in m if not k.startswith(WEIGHT)))
    rates = [k for k in keys if (rule_for(k) or MEAN).how == "rate"]  # after the seconds they divide by
    for key in [k for k in keys if k not in rates] + rates:
        have = [(m, w) for m, w in zip(every, weights) if isinstance(m.get(key), (int, float))]
        if not have:
            continue
        if any(part_weight(m, key) is not None for m, _ in have):
            out[key] = _pooled(key, [m for m, _ in have])
        else:
            out[key] = _by_rule(rule_for(key) or _fallback(key), [float(m[key]) for m, _ in have], have, out)
    return {k: out[k] for k in keys if k in out}  # the ranks' key order
