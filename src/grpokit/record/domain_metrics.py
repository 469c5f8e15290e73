"""Per-domain metrics (data.domains, docs/DOMAINS.md): a step's rewards split by the prompts' ``domain``
column, and a held-out evaluation's per-domain results joined into one summary by the rule of one held-out
set (``pooled_evaluation``: accuracy and reward over the graded prompts of every domain, not over every prompt).

A step's metrics, per domain d (its groups only):

    domain/<d>/reward        mean total reward of its completions
    domain/<d>/reward_std    mean over its groups of the within-group standard deviation
    domain/<d>/accuracy      share of its completions with full reward (>= 1 - 1e-6) from d's grader: the
                             column ``graders[d]`` names (train/domain_setup.py:domain_graders: its task's
                             verifier, else its first reward function; the held-out evaluation's grader);
                             not logged for a domain without one among its training rewards
    domain/<d>/zero_std      share of its groups whose rewards are all equal (no gradient: TRL's
                             frac_reward_zero_std, per domain)
    domain/<d>/prompts       its prompts in the batch
    domain/<d>/completion_length  mean completion length (the model's tokens)

Batches without the column (a run without domains) get none of these. Under torchrun they are taken over
every rank's rows (``domain_stats``), so ``prompts`` counts the job's groups of d.
"""

from __future__ import annotations

import torch

COLUMN = "domain"  # data/domains.py's column (record/ sits below data/ in the layers, so it is named here too)
FULL = 1 - 1e-6


def domain_stats(
    tags: list, total_N: torch.Tensor, rewards_NF: torch.Tensor, names: list[str], lengths: list[int], G: int, graders
) -> dict[str, float]:
    """The step's metrics of every domain among the prompts' ``tags`` (P; ``{}`` when none has one),
    from the completions' totals ``(N,)``, rewards ``(N, F)`` of the functions ``names`` and model
    lengths, N = P * G grouped by prompt. ``graders``: each domain's grader column among ``names`` (a
    domain not in it gets no ``accuracy``). Under torchrun the trainer passes every rank's rows (a
    domain's groups are spread unevenly over the ranks: train/step_metrics.py ``domain_metrics``)."""
    if not any(isinstance(t, str) for t in tags):
        return {}
    totals_PG = total_N.view(len(tags), G)
    out: dict[str, float] = {}
    for d in sorted({t for t in tags if isinstance(t, str)}):
        groups = [g for g, t in enumerate(tags) if t == d]
        rows = [g * G + j for g in groups for j in range(G)]
        r_PG = totals_PG[groups]
        if graders.get(d) in names:
            out[f"domain/{d}/accuracy"] = _graded_accuracy(rewards_NF[rows, names.index(graders[d])])
        out.update(
            {
                f"domain/{d}/reward": r_PG.mean().item(),
                f"domain/{d}/reward_std": r_PG.std(dim=1, unbiased=False).mean().item(),
                f"domain/{d}/zero_std": (r_PG.max(dim=1).values == r_PG.min(dim=1).values).float().mean().item(),
                f"domain/{d}/prompts": float(len(groups)),
                f"domain/{d}/completion_length": sum(lengths[i] for i in rows) / len(rows),
            }
        )
    return out


def _graded_accuracy(verifier: torch.Tensor) -> float:
    """The share of full rewards among the completions the verifier graded (NaN: it answered None, e.g. a gold
    that does not parse: left out, as held-out accuracy leaves such prompts out); NaN when it graded none."""
    graded = ~torch.isnan(verifier)
    return (verifier[graded] >= FULL).float().mean().item() if graded.any() else float("nan")


def domain_summary(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """Held-out results per domain as ``domain/<name>/<key>``, plus the pooled ``accuracy``, ``reward``,
    ``mean_length``, ``n`` and ``ungraded`` over every domain's prompts (``pooled_evaluation``)."""
    out: dict[str, float] = {}
    for d, r in results.items():
        out.update({f"domain/{d}/{k}": v for k, v in r.items()})
    return {**out, **pooled_evaluation(list(results.values()))}


# How a key of held-out summaries (train/evaluate.py) pools over parts: over the graded prompts (a part weighs its
# n - ungraded), over every prompt (a part weighs its n), or summed; a key not here (reward_<kind>) stays per part.
POOLED = {
    **dict.fromkeys(("accuracy", "reward"), "graded"),
    **dict.fromkeys(("mean_length", "tool_use_rate", "turns_mean", "no_answer_rate"), "prompts"),
    **dict.fromkeys(("n", "ungraded"), "sum"),
}


def pooled_evaluation(parts: list[dict[str, float]]) -> dict[str, float]:
    """One held-out summary of several parts' summaries (train/evaluate.py, a set each), by the rule of one set:
    ``accuracy`` and ``reward`` over the graded prompts, so each part weighs its graded count ``n - ungraded`` and
    a part with none graded (its NaN) adds nothing; NaN when no part graded any. ``mean_length`` (and an
    episode's rates) over every prompt, each part weighing its ``n``; ``n`` and ``ungraded`` summed. Pooling
    parts' summaries equals summarising their prompts as one set. A key some part lacks is left out; ``{}``
    without prompts."""
    parts = [p for p in parts if p.get("n")]
    if not parts:
        return {}
    out: dict[str, float] = {}
    for key, rule in POOLED.items():
        if not all(key in p for p in parts):
            continue
        if rule == "sum":
            out[key] = sum(p[key] for p in parts)
            continue
        weights = [p["n"] - p.get("ungraded", 0.0) if rule == "graded" else p["n"] for p in parts]
        kept = [(w, p[key]) for w, p in zip(weights, parts) if w > 0]
        total = sum(w for w, _ in kept)
        out[key] = sum(w * v for w, v in kept) / total if total else float("nan")
    return out
