"""How old the tokens a step trains are: each token's policy version, the bound, and ``rollout/staleness``.

An asynchronous sampler draws batch j with version ``max(base, j - s)`` (rollout/async_plan.py), or segment by
segment with later versions (partial rollouts, rollout/partial.py). The batch a step trains can hold other rows
too: dynamic sampling's and GFPO's adaptive refills, sampled on the trainer's own model during the step. So the
age is a property of the trained batch, not of the prefetched one, and one rule serves the sampler thread and the
worker processes alike:

* on arrival the engine stamps its batch (``arrived``): a row one version drew carries that version once
  (``types.OneVersion``, one int for the row), a partial rollout's row spanning versions one per token
  (``Rollout.sampling_versions``), and the bound is checked;
* a row with no versions (None) was drawn by the policy the step trains from: age 0;
* ``staleness_metrics`` reads the batch once it is final (after every refill, filter and correction):
  ``rollout/staleness`` is the mean over its model-sampled tokens of (step - version), ``rollout/staleness_max``
  their max (docs/SCALING.md). A step that trained 0 of its 3 prefetched groups logs 0, not s.

``ages`` reads a batch in one pass, the bound check and the metrics alike: a one-version row adds
``tokens * (step - version)`` in one product; only a partial rollout's rows are read token by token.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from grpokit.types import OneVersion, Rollout


class Ages(NamedTuple):
    """The ages of a batch's model-sampled tokens: how many, their sum, and the oldest's (None: no token)."""

    tokens: int
    total: int
    oldest: int | None


def _model_tokens(ro: Rollout, i: int) -> int:
    return len(ro.completion_ids[i]) if ro.episodes is None else sum(ro.episodes[i].model_mask)


def ages(ro: Rollout, step: int) -> Ages:
    """The ages (``step`` - version) of the batch's model-sampled tokens, in one pass (environment tokens left
    out; a row without versions, drawn by the step's own policy, is 0 old)."""
    tokens, total, oldest = 0, 0, None
    for i in range(ro.num_sequences):
        vs = ro.sampling_versions[i] if ro.sampling_versions is not None else None
        if vs is None or isinstance(vs, OneVersion):  # one version for the whole row: one product
            n, age = _model_tokens(ro, i), 0 if vs is None else step - vs.version
            row = (n, n * age, age if n else None)
        else:  # a partial rollout's row: token by token
            per_token = [step - v for v, keep in zip(vs, ro.model_mask(i)) if keep]
            row = (len(per_token), sum(per_token), max(per_token, default=None))
        tokens, total = tokens + row[0], total + row[1]
        if row[2] is not None:
            oldest = row[2] if oldest is None else max(oldest, row[2])
    return Ages(tokens, total, oldest)


def token_staleness(ro: Rollout, step: int) -> list[int]:
    """Each model-sampled token's age, one int per token (a diagnostic: ``ages`` is what the trainer reads)."""
    out: list[int] = []
    for i in range(ro.num_sequences):
        vs = ro.sampling_versions[i] if ro.sampling_versions is not None else None
        mask = ro.model_mask(i)
        out += [0] * sum(mask) if vs is None else [step - v for v, keep in zip(vs, mask) if keep]
    return out


def check_staleness(ro: Rollout, step: int, max_staleness: int) -> Ages:
    """``ages``, after checking the bound: no token more than ``max_staleness`` steps old."""
    found = ages(ro, step)
    if found.oldest is not None and found.oldest > max_staleness:
        raise RuntimeError(
            f"a token of step {step}'s batch was drawn {found.oldest} steps ago, more than "
            f"rollout.async_staleness={max_staleness}: the asynchronous schedule is broken; report it"
        )
    return found


def arrived(ro: Rollout, step: int, version: int, max_staleness: int) -> Rollout:
    """Step ``step``'s prefetched batch, sampled from ``version`` on: every row carries its version (one per row,
    a partial rollout's one per token as it came), checked against the bound."""
    if ro.sampling_versions is None:
        versions = [OneVersion(version, len(c)) for c in ro.completion_ids]
        ro = dataclasses.replace(ro, sampling_versions=versions)
    check_staleness(ro, step, max_staleness)
    return ro


def staleness_metrics(ro: Rollout, step: int) -> dict[str, float]:
    """``rollout/staleness`` (mean) and ``rollout/staleness_max`` over the model-sampled tokens of the batch step
    ``step`` trains (0 and 0 for a batch without any)."""
    found = ages(ro, step)
    return {
        "rollout/staleness": found.total / found.tokens if found.tokens else 0.0,
        "rollout/staleness_max": float(found.oldest if found.oldest is not None else 0),
    }
