"""time/sampling: the seconds the asynchronous sampler (thread or worker process) spent on the batch a step
trained, on its own clock, so the share of the sampling hidden behind the trainer's work is
1 - time/waiting_for_rollout / time/sampling (bench/async_vs_sync.py). A batch that takes SLOW_S seconds to
sample (a worker adds its tiny model's real decode): the first step waits for all of it; the next batch is sampled
during the first step's "update" (staleness 1), so the second step waits only for what that update did not
hide, while time/sampling still counts all of it."""

import time

import pytest
import torch

from grpokit.rollout.async_ import AsyncRollout
from grpokit.types import Rollout
from helpers.models import tiny_qwen2
from helpers.rollout_workers import SLOW_S, process_engine, prompt_source, slow_sample, tiny_hf_engine

UPDATE_S = 2.5 * SLOW_S  # the trainer's update, during which the next batch is sampled


def _thread_engine():
    def sample(turn_sampler, prompts):  # the trainer's episode loop, replaced by SLOW_S of decoding
        time.sleep(SLOW_S)
        return Rollout([[1], [1]], [[2]] * 6, [[-1.0]] * 6, ["length"] * 6, 3)  # 2 prompts x G=3

    model = tiny_qwen2(seed=1)
    engine = AsyncRollout(
        model,
        0,
        sample,
        prompt_source(),
        hf=tiny_hf_engine(),
        prompts_per_step=2,
        group_size=3,
        max_staleness=1,
        device=torch.device("cpu"),
        seed=7,
    )
    return engine, model


@pytest.mark.parametrize("where", ["thread", "worker"])
def test_sampling_time_counts_the_hidden_sampling(where):
    engine, model = _thread_engine() if where == "thread" else process_engine(1, sample=slow_sample)
    try:
        steps = []
        for k in range(2):
            assert engine.prefetched(2, 3) is not None
            time.sleep(UPDATE_S)
            steps.append(engine.after_update(model, k + 1))
    finally:
        engine.close()
    first, second = steps
    assert first["time/sampling"] >= SLOW_S and first["time/waiting_for_rollout"] >= 0.5 * SLOW_S
    assert second["time/sampling"] >= SLOW_S  # sampled during the first step's update, so the trainer waited
    hidden = second["time/sampling"] - second["time/waiting_for_rollout"]  # for what the update did not hide
    assert hidden >= 0.5 * min(second["time/sampling"], UPDATE_S), second
