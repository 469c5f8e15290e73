"""How old the tokens a step trains are: each token's policy version, the bound, and ``rollout/staleness``.

An asynchronous sampler draws batch j with version ``max(base, j - s)`` (rollout/async_plan.py), or segment by
segment with later versions (partial rollouts, rollout/partial.py). The batch a step trains can hold other rows
too: dynamic sampling's and GFPO's adaptive refills, sampled on the trainer's own model during the step. So the
age is a property of the trained batch, not of the prefetched one, and one rule serves the sampler thread and the
worker processes alike:

* on arrival the engine stamps its batch (``arrived``): every token gets the version that drew it
  (``Rollout.sampling_versions``; partial rollouts already carry one per token), and the bound is checked;
* a row with no versions (None) was drawn by the policy the step trains from: age 0;
* ``staleness_metrics`` reads the batch once it is final (after every refill, filter and correction):
  ``rollout/staleness`` is the mean over its model-sampled tokens of (step - version), ``rollout/staleness_max``
  their max (docs/SCALING.md). A step that trained 0 of its 3 prefetched groups logs 0, not s.
"""

from __future__ import annotations

import dataclasses

from grpokit.types import Rollout


def token_staleness(ro: Rollout, step: int) -> list[int]:
    """Steps between each model-sampled token's version and ``step`` (environment tokens left out; a row
    without versions, drawn by the step's own policy, 0 for each of its tokens)."""
    out = []
    for i in range(ro.num_sequences):
        vs = ro.sampling_versions[i] if ro.sampling_versions is not None else None
        mask = ro.model_mask(i)
        out += [0] * sum(mask) if vs is None else [step - v for v, keep in zip(vs, mask) if keep]
    return out


def check_staleness(ro: Rollout, step: int, max_staleness: int) -> list[int]:
    """``token_staleness``, after checking the bound: no token more than ``max_staleness`` steps old."""
    ages = token_staleness(ro, step)
    if ages and max(ages) > max_staleness:
        raise RuntimeError(
            f"a token of step {step}'s batch was drawn {max(ages)} steps ago, more than "
            f"rollout.async_staleness={max_staleness}: the asynchronous schedule is broken; report it"
        )
    return ages


def arrived(ro: Rollout, step: int, version: int, max_staleness: int) -> Rollout:
    """Step ``step``'s prefetched batch, sampled from ``version`` on: every row's tokens carry their version
    (those of partial rollouts already do), checked against the bound."""
    if ro.sampling_versions is None:
        ro = dataclasses.replace(ro, sampling_versions=[[version] * len(c) for c in ro.completion_ids])
    check_staleness(ro, step, max_staleness)
    return ro


def staleness_metrics(ro: Rollout, step: int) -> dict[str, float]:
    """``rollout/staleness`` (mean) and ``rollout/staleness_max`` over the model-sampled tokens of the batch step
    ``step`` trains (0 and 0 for a batch without any)."""
    ages = token_staleness(ro, step)
    return {
        "rollout/staleness": sum(ages) / len(ages) if ages else 0.0,
        "rollout/staleness_max": float(max(ages, default=0)),
    }
