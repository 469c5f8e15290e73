"""Stages 2-3 together: collect a scored batch of P groups of G completions.

Most runs sample P prompts once. Two variants change how a batch is filled, and both live here so
the loop stays the same:

* DAPO dynamic sampling (Yu et al., 2025): groups whose rewards are all equal carry no gradient;
  drop them and sample more prompts until P informative groups are collected, for at most
  ``max_rounds`` rounds (then train on what was collected, warned; verl's recipe raises instead
  after ``max_num_gen_batches``, grpokit keeps the run going and counts the shortfall). A group is
  judged by the run's judge (reward.judge, ``judged``: the columns of its functions, summed; DAPO's
  accuracy, 0 < correct < G, so that a shaping term such as the overlong penalty keeps no group), or by
  the reward as trained when it names none.
* GFPO (Shrivastava et al., 2025): sample ``sample_group_size`` > G completions per prompt, keep the
  G best by a criterion (shortest, or highest reward per token), and compute advantages on the kept
  ones only. The adaptive mode samples the extra completions only for hard prompts (group mean
  reward below ``adaptive_threshold``): easy prompts keep their first G. Both read the reward as
  trained, not the judge: the paper's token efficiency is the reward its policy is trained on per token,
  and its difficulty the mean of that reward (a filter shaping the trained reward, not a verdict).
"""

from __future__ import annotations

from typing import Callable

import torch

from grpokit.algo.advantages import flat_groups
from grpokit.rewards.values import value_stats
from grpokit.types import Prompt, ScoredBatch, gather_rows


def select(batch: ScoredBatch, groups: list[int], members: list[list[int]] | None = None) -> ScoredBatch:
    """Keep the given groups and, optionally, only the given member indices of each (same count)."""
    G = batch.group_size
    members = members or [list(range(G)) for _ in groups]
    rows = [p * G + g for p, mem in zip(groups, members) for g in mem]
    new_G = len(members[0]) if members else G
    rollout = batch.rollout.rows(rows, new_G)  # every per-row field, episodes included
    idx = torch.tensor(rows, dtype=torch.long)
    return ScoredBatch(
        [batch.prompts[p] for p in groups],
        rollout,
        [batch.texts[i] for i in rows],
        batch.rewards_NF[idx],
        batch.total_N[idx],
        batch.names,
        dict(batch.metrics),
        {k: [v[i] for i in rows] for k, v in batch.extra.items()},
        None if batch.failed_NF is None else batch.failed_NF[idx],
    )


def concat(batches: list[ScoredBatch]) -> ScoredBatch:
    first = batches[0]
    rollout = gather_rows([(b.rollout, i) for b in batches for i in range(b.rollout.num_sequences)], first.group_size)
    return ScoredBatch(
        [p for b in batches for p in b.prompts],
        rollout,
        [t for b in batches for t in b.texts],
        torch.cat([b.rewards_NF for b in batches]),
        torch.cat([b.total_N for b in batches]),
        first.names,
        _merge_metrics([b.metrics for b in batches]),
        {
            k: [x for b in batches for x in b.extra.get(k, [None] * len(b.texts))]
            for k in dict.fromkeys(k for b in batches for k in b.extra)
        },
        _cat_failed(batches),
    )


def _cat_failed(batches: list[ScoredBatch]) -> torch.Tensor | None:
    """The batches' failure masks one after the other (a batch without one: no failure)."""
    if all(b.failed_NF is None for b in batches):
        return None
    return torch.cat(
        [torch.zeros_like(b.rewards_NF, dtype=torch.bool) if b.failed_NF is None else b.failed_NF for b in batches]
    )


def gfpo_keep(batch: ScoredBatch, keep: int, criterion: str, only_groups: list[int] | None = None) -> ScoredBatch:
    """GFPO: keep ``keep`` completions of each group, the shortest (``"length"``) or those with the
    highest reward per token (``"token_efficiency"``), scored ones first (an unscorable completion, which
    every reward function returned None for, would train with advantage 0). Ties keep the earlier sample. Groups not in
    ``only_groups`` (adaptive mode) keep their first ``keep`` samples."""
    G, scored = batch.group_size, batch.scored_N.tolist()
    members = []
    for p in range(len(batch.prompts)):
        rows = list(range(p * G, (p + 1) * G))
        if only_groups is not None and p not in only_groups:
            members.append(list(range(keep)))
            continue
        lengths = [max(1, len(batch.rollout.completion_ids[i])) for i in rows]
        if criterion == "length":
            key = lambda g: (not scored[rows[g]], lengths[g], g)  # noqa: E731  GFPO: prefer short completions
        elif criterion == "token_efficiency":
            key = lambda g: (not scored[rows[g]], -batch.total_N[rows[g]].item() / lengths[g], g)  # noqa: E731
        else:
            raise ValueError(f"unknown GFPO criterion {criterion!r}; valid: length, token_efficiency")
        members.append(sorted(sorted(range(G), key=key)[:keep]))
    return select(batch, list(range(len(batch.prompts))), members)


def first_group_size(G: int, sample_group_size: int, gfpo_adaptive: bool) -> int:
    """Completions per prompt in a step's first batch, the one an asynchronous sampler prefetches: GFPO's
    ``sample_group_size`` where it oversamples every prompt (not adaptive), else ``G``."""
    return sample_group_size if sample_group_size > G and not gfpo_adaptive else G


def collect(
    sample: Callable[[int | list[Prompt], int], ScoredBatch | None],
    P: int,
    G: int,
    *,
    dynamic_sampling: bool = False,
    judged: list[int] | None = None,
    max_rounds: int = 4,
    sample_group_size: int = 0,
    gfpo_criterion: str = "length",
    gfpo_adaptive: bool = False,
    adaptive_threshold: float = 0.5,
    dist=None,
    warn: Callable[[str], None] | None = None,
) -> ScoredBatch:
    """Fill a batch of P groups of G. ``sample(n_or_prompts, group_size)`` samples and scores
    ``group_size`` completions for n fresh prompts from the data, or for the given prompts (an
    empty list may return None).

    Dynamic sampling drops the groups whose judged values are all equal (``judged``: the ``rewards_NF``
    columns summed, None: ``total_N``) and samples at most ``max_rounds`` rounds, never more. When they found fewer than
    P informative groups the step trains on those it found; when they found none, on the last
    round's groups as sampled (all flat: zero advantages, so only a KL or entropy term trains), as
    the rounds drew them. Then ``warn`` (the trainer's, which says it once a run) gets one sentence;
    the ``dynamic_sampling/*`` metrics (``_dynamic_metrics``) count what was sampled, dropped and
    trained in every step.

    ``dist`` (a ``distributed.DistContext``, several ranks): P is this rank's share and the batch
    is filled collectively; see ``_share_rounds``.
    """
    many = dist is not None and dist.active
    K = dist.world_size if many else 1
    gfpo = (sample_group_size, gfpo_criterion, gfpo_adaptive, adaptive_threshold)
    rounds_kept, last, sampled = _rounds(sample, P, G, dynamic_sampling, judged, max_rounds, gfpo, dist, K)
    if many and dynamic_sampling:
        out = _share_rounds(rounds_kept, last, P, G, dist)
    else:
        kept = [b for b in rounds_kept if b.prompts] or [last]  # none informative: the last round as drawn
        out = kept[0] if len(kept) == 1 else concat(kept)  # one round: the very batch (trainer_forwards.step_logprobs)
        if len(out.prompts) > P:
            out = select(out, list(range(P)))
        out.metrics = _merge_metrics([b.metrics for b in rounds_kept])  # every round's completions scored
    if many and sample_group_size > G and gfpo_adaptive and not dynamic_sampling:  # a count: summed over ranks
        out.metrics["gfpo/hard_prompts"] = dist.sum_float(out.metrics["gfpo/hard_prompts"])
    if dynamic_sampling or sample_group_size > G:
        out.metrics = kept_reward_metrics(out)
    if dynamic_sampling:
        # the flat groups found, the informative ones kept, the prompts sampled: global counts, one all-reduce
        local = [
            sampled - sum(len(b.prompts) for b in rounds_kept),
            len(out.prompts) - len(_flat_indices(out, judged)),
            sampled,
        ]
        flat_found, kept, sampled_all = dist.sum_floats(local) if many else [float(n) for n in local]
        flat_trained = len(out.prompts) * K - kept
        out.metrics.update(_dynamic_metrics(len(rounds_kept), sampled_all, flat_found, kept, flat_trained))
        if kept < P * K and warn is not None:
            warn(
                f"dynamic sampling (algo.dynamic_sampling) found fewer than train.prompts_per_step={P * K} "
                f"informative groups in algo.max_sampling_rounds={max_rounds} rounds; such a step trains on "
                "those it found, or, with none, on its last round's flat groups (zero advantages), and "
                "dynamic_sampling/kept_groups logs each step's count; raise algo.max_sampling_rounds or use "
                "prompts the model solves sometimes (data.curriculum=frontier)"
            )
    return out


def _rounds(
    sample, P: int, G: int, dynamic_sampling: bool, judged: list[int] | None, max_rounds: int, gfpo: tuple, dist, K: int
):
    """The sampling rounds of one step on this rank: every round's batch as it trains (with dynamic
    sampling, its informative groups only, judged by the ``judged`` columns), the last round's batch as drawn,
    and how many prompts were sampled. A round is sampled only while the global count of informative
    groups is below P * K (K ranks; ``dist`` is read only when K > 1) and fewer than ``max_rounds`` rounds
    ran (one round without dynamic sampling)."""
    sample_group_size, criterion, adaptive, threshold = gfpo
    many = K > 1
    rounds_kept: list[ScoredBatch] = []
    n_kept, sampled = 0, 0
    while True:
        batch = sample(P, first_group_size(G, sample_group_size, adaptive))
        sampled += len(batch.prompts)
        if sample_group_size > G and adaptive:
            batch, hard = _adaptive_extra(batch, sample, sample_group_size, G, threshold, always=many)
            batch = gfpo_keep(batch, G, criterion, hard)
        elif sample_group_size > G:
            batch = gfpo_keep(batch, G, criterion)
        last = batch
        if dynamic_sampling:  # DAPO: drop groups whose rewards are all equal
            flat = set(_flat_indices(batch, judged))
            batch = select(batch, [p for p in range(len(batch.prompts)) if p not in flat])
        rounds_kept.append(batch)
        # several ranks: the stop rule reads the global count, so every rank runs the same rounds
        n_kept += int(dist.sum_float(len(batch.prompts))) if many and dynamic_sampling else len(batch.prompts)
        if not dynamic_sampling or n_kept >= P * K or len(rounds_kept) >= max_rounds:
            return rounds_kept, last, sampled


def _flat_indices(batch: ScoredBatch, judged: list[int] | None = None) -> list[int]:
    """The groups of ``batch`` whose judged values are all equal over the completions scored (one no function
    scored is no reward of 0): DAPO drops them. ``judged``: the ``rewards_NF`` columns whose sum is judged (a
    completion none of them scored is left out), None: ``total_N``, the reward as trained."""
    G = batch.group_size
    values_N, valid_N = batch.judged(judged)  # DAPO: the verifier's accuracy (reward.judge=[task])
    return flat_groups(values_N.view(-1, G), valid=valid_N.view(-1, G)).nonzero()[:, 0].tolist()


def _dynamic_metrics(rounds: int, sampled: float, flat: float, kept: float, flat_trained: float) -> dict[str, float]:
    """DAPO's dynamic sampling in one step (global counts): its rounds (at most algo.max_sampling_rounds), the
    prompts sampled, the flat groups dropped (found flat and not trained), the informative groups kept (what
    trains; below train.prompts_per_step when the rounds ran out) and the flat groups trained because the rounds
    found no informative one (the last round's, as drawn)."""
    return {
        "dynamic_sampling/rounds": float(rounds),
        "dynamic_sampling/dropped_groups": flat - flat_trained,
        "dynamic_sampling/kept_groups": kept,
        "dynamic_sampling/sampled_prompts": sampled,
        "dynamic_sampling/flat_groups_trained": flat_trained,
    }


def _share_rounds(rounds_kept: list[ScoredBatch], last: ScoredBatch, P: int, G: int, dist) -> ScoredBatch:
    """DAPO on K ranks: pool every rank's kept groups and give each rank an equal share.

    Ranks keep different numbers of groups, but the later stages need equal shares (advantages are
    all-gathered row by row; FSDP needs the same number of forward passes on every rank). So the
    kept groups are all-gathered and ordered as one process would have kept them, round by round
    and, within a round, rank by rank (rank r drew the r-th slice of the round's prompts). The
    first min(total, K*P) of them, rounded down to a multiple of K, are split evenly. Fewer kept
    groups than ranks: every rank trains on its last round as drawn (``last``), as one process does
    when none are kept; no round beyond the limit is sampled. Each rank keeps the reward metrics of
    every completion it sampled itself.
    """
    K = dist.world_size
    every = dist.gather_objects(rounds_kept)  # every[r][i]: rank r's kept groups of round i
    ordered = [every[r][i] for i in range(len(rounds_kept)) for r in range(K) if every[r][i].prompts]
    total = sum(len(b.prompts) for b in ordered)
    share = min(total, K * P) // K
    out = last if share == 0 else select(concat(ordered), list(range(dist.rank * share, (dist.rank + 1) * share)))
    out.metrics = _merge_metrics([b.metrics for b in rounds_kept])
    if "gfpo/hard_prompts" in out.metrics:  # a count: per round the sum over ranks, as one process counts it
        per_round = [sum(every[r][i].metrics["gfpo/hard_prompts"] for r in range(K)) for i in range(len(rounds_kept))]
        out.metrics["gfpo/hard_prompts"] = sum(per_round) / len(per_round)
    return out


def _adaptive_extra(
    batch: ScoredBatch, sample, sample_group_size: int, G: int, threshold: float, always: bool = False
) -> tuple[ScoredBatch, list[int]]:
    """GFPO adaptive: prompts whose first G samples score below ``threshold`` on average get
    ``sample_group_size - G`` more samples; the batch becomes uniformly ``sample_group_size`` wide
    (easy prompts are padded with copies that ``gfpo_keep`` never selects). ``always``: call
    ``sample`` even with no hard prompt (several ranks: a sharded model samples in step)."""
    extra_n = sample_group_size - G
    hard = [p for p in range(len(batch.prompts)) if _scored_mean(batch, p * G, (p + 1) * G) < threshold]
    more = sample([batch.prompts[p] for p in hard], extra_n) if hard or always else None
    rewards, totals, texts, sources, failed = [], [], [], [], []
    for p in range(len(batch.prompts)):
        rows = list(range(p * G, (p + 1) * G))
        src = [(batch, i) for i in rows]
        if p in hard:
            k = hard.index(p)
            src += [(more, k * extra_n + j) for j in range(extra_n)]
        else:
            src += [(batch, rows[0])] * extra_n  # placeholders: easy groups keep their first G
        for b, i in src:
            failed.append(
                torch.zeros_like(b.rewards_NF[i], dtype=torch.bool) if b.failed_NF is None else b.failed_NF[i]
            )
            rewards.append(b.rewards_NF[i])
            totals.append(b.total_N[i])
            texts.append(b.texts[i])
            sources.append((b.rollout, i))
    ro = gather_rows(sources, sample_group_size)
    metrics = {**batch.metrics, "gfpo/hard_prompts": float(len(hard))}
    out = ScoredBatch(batch.prompts, ro, texts, torch.stack(rewards), torch.stack(totals), batch.names, metrics)
    out.failed_NF = torch.stack(failed)
    return out, hard


def _scored_mean(batch: ScoredBatch, start: int, stop: int) -> float:
    """The mean reward of rows ``start:stop`` over those a reward function scored (0 when none was)."""
    scored = batch.scored_N[start:stop]
    return float(batch.total_N[start:stop][scored].mean()) if bool(scored.any()) else 0.0


def kept_reward_metrics(batch: ScoredBatch) -> dict[str, float]:
    """``batch.metrics`` with every ``rewards/<f>/mean`` and ``/std`` taken over the rows ``batch`` keeps (what
    trains, the rows the step's ``reward`` is the mean of); the runner's values over every completion sampled
    (averaged over the sampling rounds), and its ``reward``, move to ``sampled/<name>``. Dynamic sampling and
    GFPO drop rows after scoring: before, the two views were logged side by side as if they were one."""
    out = dict(batch.metrics)
    out.pop("reward_std", None)  # the runner's (over all rows, not per group); step_metrics logs the kept one's
    names = ["reward"] + [f"rewards/{n}/{s}" for n in batch.names for s in ("mean", "std")]
    out.update({f"sampled/{k}": out.pop(k) for k in names if k in out})
    for f, name in enumerate(batch.names):
        failed = None if batch.failed_NF is None else batch.failed_NF[:, f]
        out.update(value_stats(batch.rewards_NF[:, f], failed, name))
    return out


# Per-batch counts (rewards/runner.py) add up over batches; everything else is averaged.
_COUNTS = (
    "failures",
    "not_applicable",
    "timeouts",
    "nonfinite",
    "tampering",
    "crashes",
    "limits",
    "zeroed",
    "scored",
    "unscored",
)


def _merge_metrics(ms: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in ms[0]:
        vals = [m[k] for m in ms if k in m]
        out[k] = sum(vals) if k.endswith(_COUNTS) else sum(vals) / len(vals)
    return out
