"""How each of a step's metrics combines over data-parallel ranks: one declared rule per metric name.

Under torchrun every rank measures its own share of the step (P/K prompts, each group whole on one rank) and
rank 0 writes one line for the job. What a rank's value means decides how the K values combine, so every
metric grpokit logs has a rule in ``RULES`` (tests/record/test_rank_reduction.py checks the names grpokit's
sources write):

    same      the job's figure already, equal on every rank: computed from all-reduced sums (the update's
              loss, grad_norm, kl ...), over every rank's gathered rows (rewards/<f>/mean and /std,
              domain/<d>/*, the advantages), or from all ranks' parts (algo/rank_stats.py); rank 0's is kept
    mean      a mean over this rank's rows when every rank has as many (completions, groups, episodes):
              the mean of the ranks' values is the job's mean
    sum       a count (failures, scored completions, reset failures): the job's is the sum
    min, max  the smallest / largest of the ranks' (lengths, a step's time: the slowest rank's)
    weighted  a rate whose denominator differs between ranks: the ranks' values weighted by ``by``, a count
              of the same rank (another metric, or a weight the trainer passes: ``tokens``, the rank's
              completion tokens)

A name no rule covers (a reward function's own ``log_metric``) is the mean over the ranks that logged it, or
the min / max for a name ending in ``min`` / ``max``. The union of the ranks' keys is kept, so a metric one
rank lacks cannot hang the job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Rule:
    """How one metric combines over ranks (see the module docstring)."""

    how: str
    """``same``, ``mean``, ``sum``, ``min``, ``max`` or ``weighted``."""
    by: str = ""
    """``weighted``: the weight's name, a metric of the same rank or a weight the caller passes."""


SAME, MEAN, SUM, MIN, MAX = Rule("same"), Rule("mean"), Rule("sum"), Rule("min"), Rule("max")
TOKENS = Rule("weighted", "tokens")

_COUNTS = ("failures", "nonfinite", "not_applicable", "zeroed", "timeouts", "tampering", "crashes", "limits")

RULES: tuple[tuple[str, Rule], ...] = (
    # counts
    *((f"rewards/*/{c}", SUM) for c in (*_COUNTS, "machine_failures")),
    ("rewards/scored", SUM),
    ("episodes/reset_failures", SUM),
    ("gec/corrected_groups", SUM),
    ("rollout/worker_faults", SUM),
    ("rollout/workers", SUM),
    # over every rank's rows, or from every rank's parts (train/step_metrics.py, algo/rank_stats.py)
    ("rewards/*/mean", SAME),
    ("rewards/*/std", SAME),
    ("domain/*", SAME),
    ("tokens_per_second", SAME),
    ("rollout/tokens_per_second", SAME),
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


def _fallback(key: str) -> Rule:
    leaf = key.rsplit("/", 1)[-1]
    return MIN if leaf.endswith("min") else MAX if leaf.endswith("max") else MEAN


def combine(every: list[dict[str, float]], weights: list[dict[str, float]] | None = None) -> dict[str, float]:
    """One line of the job from every rank's metrics (rank order), each key by its rule; ``weights``: per rank,
    the weights a ``weighted`` rule may name beside the rank's metrics (``tokens``). Non-numbers are dropped.

    Example, two ranks: {"rewards/f/failures": 1, "completions/max_length": 5, "reward": 0.5} and
    {"rewards/f/failures": 2, "completions/max_length": 7, "reward": 1.0} -> failures 3 (a count),
    max_length 7, reward 0.75 (each rank's mean over as many completions)."""
    weights = weights or [{} for _ in every]
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for m in every for k in m):
        have = [(m, w) for m, w in zip(every, weights) if isinstance(m.get(key), (int, float))]
        if not have:
            continue
        vals = [float(m[key]) for m, _ in have]
        rule = rule_for(key) or _fallback(key)
        if rule.how == "same":
            out[key] = vals[0]
        elif rule.how == "sum":
            out[key] = sum(vals)
        elif rule.how in ("min", "max"):  # NaN (a rank where none had one: clip_ratio/low_min) is skipped
            seen = [v for v in vals if not math.isnan(v)] or [math.nan]
            out[key] = min(seen) if rule.how == "min" else max(seen)
        elif rule.how == "weighted":
            ws = [float(w.get(rule.by, m.get(rule.by, 0.0))) for m, w in have]
            out[key] = sum(w * v for w, v in zip(ws, vals)) / sum(ws) if sum(ws) > 0 else sum(vals) / len(vals)
        else:
            out[key] = sum(vals) / len(vals)
    return out
