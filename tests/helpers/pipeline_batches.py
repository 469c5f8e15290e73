"""Hand-built scored batches and token batches for the pipeline's unit tests (no model)."""

from __future__ import annotations

import torch

from grpokit.algo.pipeline import LogProbs, StepSettings, update_inputs
from grpokit.config.sections import AlgoConfig
from grpokit.types import Episode, Prompt, Rollout, ScoredBatch, TokenBatch


def scored(
    rewards: list[float],
    group_size: int,
    lengths: list[int],
    finish: list[str] | None = None,
    episodes: list[Episode] | None = None,
) -> tuple[ScoredBatch, TokenBatch]:
    """A batch of len(rewards) completions, ``lengths[i]`` tokens each, and its token batch (width max(lengths))."""
    N, T = len(rewards), max(lengths)
    P = N // group_size
    prompts = [Prompt(text=f"p{p}", ids=[1], columns={"answer": "1"}) for p in range(P)]
    comps = [[5] * n for n in lengths]
    ro = Rollout([[1]] * P, comps, [[0.0] * n for n in lengths], finish or ["eos"] * N, group_size, episodes)
    total = torch.tensor(rewards)
    sb = ScoredBatch(prompts, ro, [f"t{i}" for i in range(N)], total[:, None], total, ["r"])
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
    ids = torch.full((N, 1 + T), 5)
    batch = TokenBatch(
        ids, torch.cat([torch.ones(N, 1), mask], dim=1), torch.arange(1 + T).expand(N, -1), ids[:, 1:], mask
    )
    return sb, batch


def run(algo: AlgoConfig, sb, batch, lp: LogProbs | None = None, **settings):
    return update_inputs(StepSettings(algo, **settings), sb, batch, lp or LogProbs())
