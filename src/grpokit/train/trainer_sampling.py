"""Stages 2 and 3 of the Trainer (a mixin of it, train/loop.py): sample G episodes per prompt through
the rollout engine (or TRL's rollout_func) and score them with the reward functions."""

from __future__ import annotations

from typing import Any

import torch

from grpokit.rewards.inputs import reward_inputs, reward_prompts, row_prompts
from grpokit.rollout.engine import RolloutEngine
from grpokit.rollout.finish import end_ids
from grpokit.types import Prompt, ScoredBatch, repeat_columns

from . import engines
from .rollout_func import call_rollout_func


class TrainerSampling:
    """``sample_and_score`` and the engine it samples with; the Trainer supplies ``cfg``, ``engine``,
    ``episodes``, ``runner``, ``model``, ``tokenizer`` and the rest its construction sets."""

    def sample_and_score(self, prompts: int | list[Prompt], group_size: int) -> ScoredBatch | None:
        """Sample ``group_size`` completions for n fresh prompts (or the given ones) and score them;
        every hook in ``on_sampled`` sees the batch. An empty list (a rank with nothing to add while
        others sample) returns None."""
        ro = None
        if isinstance(prompts, int):  # this rank's slice of the step's prompts, or an async prefetch
            prompts, ro = engines.next_prompts(self.engine, self.sampler, self.dist, prompts, group_size)
        extra: dict[str, list] = {}
        with (
            self._timer("rollout"),
            self.autocast(),
            engines.sampling_model(self.model, self.dist) as model,
        ):  # FSDP: ranks in step
            self.model.eval()
            if ro is None and self.rollout_func is not None and prompts:  # TRL's rollout_func replaces stage 2
                ends = end_ids(self.eos, self.tokenizer.pad_token_id)
                ro, extra = call_rollout_func(self.rollout_func, self, prompts, group_size, ends)
            if ro is None and prompts:  # the episode loop on vLLM (colocated or server) or on the model itself
                ro = self.episodes.run(self.turn_sampler(model), prompts, group_size, self.params)
            # the round's last turn is sampled; with no prompt too: a vLLM TP group waits for every rank
            self.engine.finish_sampling()
        if not prompts:
            return None
        texts = [self._decode(c) for c in ro.completion_ids]
        with self._timer("reward"):
            conv = self.cfg.reward.convention
            rows = [p for p in prompts for _ in range(group_size)]
            completions, env_columns = reward_inputs(ro, texts, rows, conv, self.episodes.parse_message)
            columns = {**repeat_columns(prompts, group_size), **row_prompts(rows, conv), **env_columns, **extra}
            scored = self.runner.score(
                reward_prompts(prompts, group_size, conv, ro.episodes),
                completions,
                ro.completion_ids,
                group_size,
                columns,
                trainer_state=self.reward_state(),
            )
        sb = ScoredBatch(
            prompts,
            ro,
            texts,
            scored.rewards_NF,
            scored.total_N,
            scored.names,
            scored.metrics,
            scored.extra,
            scored.failed_NF,
        )
        for hook in self.on_sampled:
            hook(sb)
        return sb

    def _sample_async(self, sample, prompts) -> Any:
        """One batch's episodes for the async sampler's thread, each turn decoded by ``sample`` (the async
        engine's turn sampler on its snapshot, with the batch's own generator)."""
        with self.autocast():  # the same episode loop as synchronous sampling (one turn without tools)
            return self.episodes.run(sample, prompts, engines.prefetch_group_size(self.cfg.rollout), self.params)

    def turn_sampler(self, model, generator: torch.Generator | None = None):
        """``(contexts, group_size, params) -> Rollout``: one batched decode of a turn, by the engine
        (on ``model`` where it samples on the trainer's model; ``generator``: the async sampler's own)."""
        return self.engine.turn_sampler(model, generator)

    def use_engine(self, engine: RolloutEngine) -> None:
        """Sample with ``engine`` from now on (the one in use is closed first): a test's fake vLLM, or
        an engine built elsewhere."""
        self.engine.close()
        self.engine = engine

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
