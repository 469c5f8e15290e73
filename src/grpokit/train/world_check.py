"""Settings that cannot work with the run's number of ranks, each refused in one sentence."""

from __future__ import annotations

import torch

from grpokit.config.sections import Config, ConfigError

from .distributed import DistContext


def check_world(cfg: Config, ctx: DistContext) -> None:
    """Settings that cannot work with ``ctx.world_size`` ranks, each as one sentence."""
    t, k = cfg.train, ctx.world_size
    if t.fsdp and not torch.distributed.is_initialized():
        raise ConfigError(
            "train.fsdp=true needs a process group; launch with torchrun --nproc_per_node N "
            "(N = 1 runs FSDP on one GPU, to try it)"
        )
    tp = cfg.rollout.vllm_tensor_parallel_size
    if k % tp:  # also with one process: a group of tp ranks needs tp processes
        raise ConfigError(
            f"rollout.vllm_tensor_parallel_size={tp} must divide the {k} ranks (one engine per group of {tp} "
            f"consecutive ranks); use one of: {', '.join(str(d) for d in range(1, k + 1) if k % d == 0)}"
        )
    if t.fsdp and cfg.rollout.async_staleness:  # the sampler's snapshot would need the gathered weights
        raise ConfigError(
            f"rollout.async_staleness={cfg.rollout.async_staleness} does not run with train.fsdp=true (a sharded "
            "model has no whole copy to sample with); set rollout.async_staleness=0 or train.fsdp=false"
        )
    if k == 1:
        return
    if t.accumulation_slices > 1:  # a pending update's gradient is per rank until it is applied
        raise ConfigError(
            f"train.accumulation_slices={t.accumulation_slices} runs on one process only, not {k} ranks; set it to 1"
        )
    if t.prompts_per_step % k:
        raise ConfigError(
            f"train.prompts_per_step={t.prompts_per_step} must be divisible by the {k} ranks "
            f"(each rank keeps whole groups); use a multiple of {k}"
        )
