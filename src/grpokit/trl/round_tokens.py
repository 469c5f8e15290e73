"""TRL's token count and terminated-length metrics of a sampling round.

TRL 1.16 (``GRPOTrainer._generate_and_score_completions``) adds every process's prompt and completion tokens to
``state.num_input_tokens_seen`` (logged as ``num_tokens``, a running total) and takes
``completions/{mean,min,max}_terminated_length`` over the gathered lengths of every process's completions that
did not hit the length cap. The bridge (bridge.py) collects each sampling call's part here and combines the
round's over the ranks.
"""

from __future__ import annotations


def sampled_tokens(rollout, lengths: list[int]) -> tuple[float, list[int]]:
    """TRL's token count of one sampling call (the prompt and completion tokens of every sequence) and the
    lengths of its terminated completions (those that did not hit the length cap)."""
    prompt_tokens = sum(len(rollout.prompt_of(i)) for i in range(len(rollout.completion_ids)))
    done = [n for n, why in zip(lengths, rollout.finish_reasons) if why != "length"]
    return float(prompt_tokens + sum(len(c) for c in rollout.completion_ids)), done


def round_counts(sampled: list[tuple[float, list[int]]], dist=None) -> tuple[float, float, list[int]]:
    """A round's sampling calls (``sampled_tokens`` of each), combined over the ranks of ``dist`` (a DistContext;
    None or inactive: this process alone): the calls, their tokens (one all-reduce of both) and every process's
    terminated lengths (gathered, as TRL). Collective under torchrun."""
    calls, tokens = float(len(sampled)), sum(t for t, _ in sampled)
    done = [n for _, lengths in sampled for n in lengths]
    if dist is not None and dist.active:
        import torch

        calls, tokens = dist.sum_floats([calls, tokens])
        done = [int(n) for n in dist.gather_varlen(torch.tensor(done, dtype=torch.long)).tolist()]
    return calls, tokens, done


def terminated_lengths(done: list[int]) -> dict[str, float]:
    """TRL's ``completions/{mean,min,max}_terminated_length`` over the terminated completions' lengths ``done``
    (every process's, as TRL gathers them); 0 when none terminated, as TRL."""
    return {
        "completions/mean_terminated_length": sum(done) / len(done) if done else 0.0,
        "completions/min_terminated_length": float(min(done)) if done else 0.0,
        "completions/max_terminated_length": float(max(done)) if done else 0.0,
    }


def sampling_extras(rollout, lengths: list[int]) -> dict[str, float]:
    """TRL's token count and terminated-length metrics of one sampling call of this process (an evaluation
    batch): ``num_tokens`` and ``terminated_lengths``."""
    tokens, done = sampled_tokens(rollout, lengths)
    return {"num_tokens": tokens, **terminated_lengths(done)}
