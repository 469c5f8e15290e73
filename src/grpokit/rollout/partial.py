"""Partial rollouts: a generation in flight when newer weights arrive goes on under them.

The rule (``rollout.async_partial_tokens`` = K > 0, the asynchronous sampler's hf engines: its thread or its
worker processes, rollout/async_worker.py). Batch j's
decode runs in segments of K tokens; segment m (tokens m*K .. m*K + K - 1 of every completion) is
drawn by version ``min(v0 + m, j)`` of the policy, v0 = ``max(base, j - s)`` the version the batch
starts with (rollout/async_plan.py). A completion's first tokens can thus come from version v and the
rest from v + 1, and each token keeps the version and the sampler log-probability it was drawn with
(``Rollout.sampling_versions``, ``Rollout.sampling_logprobs``): the importance ratio, TIS and the
mismatch metrics already work per token, so a completion of two versions needs nothing else there.
The segment's version is fixed by (j, m), not by when an update finishes, so the sampler waits for a
version not yet published, and the run stays deterministic and resumes exactly as without partial
rollouts (a checkpoint's in-flight batches are redone from their start, with their generator).

The staleness bound per token: a token of batch j is drawn by a version >= v0 = j - s, so it is at
most s = ``rollout.async_staleness`` steps old when step j trains it. The bound holds by
construction; ``check_staleness`` (rollout/staleness.py) verifies it on every batch handed to the trainer and
stops the run in one sentence if a token were older (no token is masked or dropped, because none can be).

The cache is recomputed, not kept: each segment prefills the prompt and the tokens drawn so far under
its own weights, so every token is drawn from exactly the distribution its version gives (the
recorded log-probability is the one the trainer's ratio needs). Keeping the old keys/values (APRIL,
slime) would skip that prefill but draw the later tokens from a mixture of two versions; the
difference measured on a tiny model is in docs/SCALING.md (tests/rollout/test_partial_rollouts.py).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import torch

from grpokit.types import OneVersion, Rollout

from .hf import generate
from .sampling import SamplingParams


def segment_version(index: int, segment: int, start: int) -> int:
    """The version drawing segment ``segment`` of batch ``index`` when the batch starts at ``start``."""
    return min(start + segment, index)


def generate_partial(
    version_model: Callable[[int], tuple[torch.nn.Module, int]],
    prompt_ids: list[list[int]],
    group_size: int,
    params: SamplingParams,
    segment_tokens: int,
    *,
    eos_token_ids: set[int],
    pad_token_id: int,
    generator: torch.Generator,
    decode=None,
    engine: str = "auto",
) -> Rollout:
    """rollout/hf.py's ``generate`` in segments of ``segment_tokens`` tokens, segment m drawn by the
    model ``version_model(m)`` returns (with its version); the cache is recomputed at each segment.
    Rows as ``generate``'s; ``sampling_versions[i][t]`` is the version that drew token t of row i (a row
    of one version a ``OneVersion``)."""
    G, N = group_size, len(prompt_ids) * group_size
    tokens: list[list[int]] = [[] for _ in range(N)]
    logps: list[list[float]] = [[] for _ in range(N)]
    versions: list[list[int]] = [[] for _ in range(N)]
    reasons = ["length"] * N
    active, done, m = list(range(N)), 0, 0
    kw = dict(eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, generator=generator, decode=decode)
    while active and done < params.max_new_tokens:
        model, v = version_model(m)
        seg = dataclasses.replace(params, max_new_tokens=min(segment_tokens, params.max_new_tokens - done))
        if m == 0:  # the prompts' caches shared by their G samples, as without segments
            ro = generate(model, prompt_ids, G, seg, engine=engine, **kw)
        else:  # recompute: prompt and tokens so far prefilled by this segment's weights
            ro = generate(model, [prompt_ids[i // G] + tokens[i] for i in active], 1, seg, engine=engine, **kw)
        going = []
        for j, r in enumerate(active):  # row j of this segment is row r of the batch
            before = len(tokens[r])
            tokens[r] += ro.completion_ids[j]
            logps[r] += ro.sampling_logprobs[j]
            versions[r] += [v] * len(ro.completion_ids[j])
            reasons[r] = ro.finish_reasons[j]
            if reasons[r] == "length" and params.stop and decode is not None:
                _cut_at_stop(r, before, tokens, logps, versions, reasons, params.stop, decode)
            if reasons[r] == "length":
                going.append(r)
        active, done, m = going, done + seg.max_new_tokens, m + 1
    return Rollout(
        prompt_ids=[list(p) for p in prompt_ids],
        completion_ids=tokens,
        sampling_logprobs=logps,
        finish_reasons=reasons,
        group_size=G,
        sampling_versions=[_compact(vs) for vs in versions],
    )


def _compact(versions: list[int]) -> Sequence[int]:
    """A row one segment's version drew entirely (it ended within that segment) as one int; a row spanning
    versions keeps one per token (rollout/staleness.py reads the first in one product)."""
    if versions and versions.count(versions[0]) == len(versions):
        return OneVersion(versions[0], len(versions))
    return versions


def _cut_at_stop(r: int, before: int, tokens, logps, versions, reasons, stop: tuple[str, ...], decode) -> None:
    """A stop string split across a segment boundary (the segment's own loop sees its tokens only):
    cut row ``r`` after the first of its new tokens that completes one, as one unsegmented loop would."""
    if not any(s in decode(tokens[r]) for s in stop):
        return
    for t in range(before, len(tokens[r])):
        if any(s in decode(tokens[r][: t + 1]) for s in stop):
            del tokens[r][t + 1 :], logps[r][t + 1 :], versions[r][t + 1 :]
            reasons[r] = "stop"
            return
