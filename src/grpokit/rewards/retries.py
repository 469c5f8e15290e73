"""A reward call that raised, taken apart (for rewards/runner.py).

A call of several completions (a group, or under grpokit.trl the whole batch) that raised is not every
completion's failure. Each of its completions is called alone to find those at fault; the others are then
scored together again in one call, so a function that looks across completions (a value relative to the
batch's mean, a rank within the group) computes it over them, as it would have over the whole call, not
over one completion at a time (where a batch-relative value is 0 for everyone). Their values alone stand
when that call fails too, when one completion is left, or when none failed alone (the call raised only
together: calling the same completions together again would raise again).

The call again gets ``group_size`` = the completions each prompt keeps there when every prompt keeps the
same number (a whole group when none of it failed), else 1: no grouping can be read from it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from .pool import Outcome

Run = Callable[[list[dict[str, Any]]], list[Outcome]]
"""Calls of one function, one keyword dict each, run side by side: one Outcome per call, in order."""


def take_apart(
    run: Run, calls: list[list[int]], errors: list[str], kwargs_for: Callable, group_size: int
) -> list[tuple[list[int], Outcome, str]]:
    """The outcomes that score the completions of ``calls`` (each the completions of a call that raised
    ``errors[k]``), as ``(completions, outcome, what the call was)``: each failing completion's own call, then
    the others' call together (or, failing that, their own calls). ``kwargs_for(completions, group_size)``
    builds a call's keywords. Two rounds of ``run``: every completion alone, then the calls together."""
    if not calls:
        return []
    singles = [i for idx in calls for i in idx]
    alone = dict(zip(singles, run([kwargs_for([i], 1) for i in singles])))
    out: list[tuple[list[int], Outcome, str]] = []
    rejoined: list[tuple[list[int], str]] = []
    for idx, error in zip(calls, errors):
        why = f"after the call of its {len(idx)} completions raised {_short(error)}"
        healthy = [i for i in idx if _healthy(alone[i])]
        out.extend(([i], alone[i], f"completion {i} called alone {why}") for i in idx if i not in healthy)
        if 1 < len(healthy) < len(idx):
            rejoined.append((healthy, why))
        else:
            out.extend(([i], alone[i], f"completion {i} called alone {why}") for i in healthy)
    together = run([kwargs_for(h, _group_size(h, group_size)) for h, _ in rejoined])
    for (h, why), res in zip(rejoined, together):
        if res.ok:
            out.append((h, res, f"its {len(h)} completions that scored alone, called together again {why}"))
        else:  # the function fails on these together: each one's own value stands
            out.extend(([i], alone[i], f"completion {i} called alone {why}") for i in h)
    return out


def _healthy(out: Outcome) -> bool:
    return out.ok and not getattr(out.value, "broken", "")


def _group_size(completions: list[int], group_size: int) -> int:
    """How many completions of each prompt the call holds, when that is the same for every prompt; else 1."""
    kept = set(Counter(i // group_size for i in completions).values())
    return kept.pop() if len(kept) == 1 else 1


def _short(error: str) -> str:
    first = (error.strip().splitlines() or ["an error"])[0]
    return first if len(first) <= 160 else first[:157] + "..."
