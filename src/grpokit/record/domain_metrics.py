"""Per-domain metrics (data.domains, docs/DOMAINS.md): a step's rewards split by the prompts' ``domain``
column, and a held-out evaluation's per-domain results joined into one summary.

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
    """Held-out results per domain as ``domain/<name>/<key>``, plus ``accuracy``, ``reward`` and
    ``mean_length`` over every domain's prompts (weighted by their counts) and ``n``, their number."""
    out: dict[str, float] = {}
    n = sum(r.get("n", 0.0) for r in results.values())
    for d, r in results.items():
        out.update({f"domain/{d}/{k}": v for k, v in r.items()})
    if n:
        for key in ("accuracy", "reward", "mean_length"):
            out[key] = sum(r.get(key, 0.0) * r.get("n", 0.0) for r in results.values()) / n
        out["n"] = n
    return out
