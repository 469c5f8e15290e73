"""TRL's batch and step arguments -> grpokit's batch, step count and epochs.

Part of mapping.py's table (its batch and step rules call these); kept apart so each file stays
readable. A TRL step is one optimizer update; a grpokit step (a round) samples one generation batch and
makes num_iterations * updates_per_batch updates on it (mapping.py's docstring). An epoch is TRL's: its
RepeatSampler keeps whole generation batches of train_dataset only, and transformers counts the
optimizer updates they feed (checked against TRL itself in tests/test_trl_scripts.py).
"""

from __future__ import annotations

import math
from typing import Any

from grpokit.config.base import ConfigError
from .config import GRPOConfig


def generation_steps(a: GRPOConfig, world_size: int) -> int:
    """TRL's steps_per_generation: given, or from generation_batch_size, or gradient_accumulation_steps."""
    if a.steps_per_generation is not None and a.generation_batch_size is not None:
        raise ConfigError("GRPOConfig arguments steps_per_generation and generation_batch_size are both set; set one of them")
    if a.generation_batch_size is None:
        return a.steps_per_generation or a.gradient_accumulation_steps
    per_pass = a.per_device_train_batch_size * world_size
    if a.generation_batch_size % per_pass:
        raise ConfigError(f"GRPOConfig argument generation_batch_size={a.generation_batch_size} is not a multiple of "
                          f"per_device_train_batch_size * processes = {per_pass}; make it one")
    return a.generation_batch_size // per_pass


def updates_per_round(a: GRPOConfig, world_size: int) -> int:
    """Optimizer steps one generation batch feeds per num_iterations pass: steps_per_generation / gradient_accumulation_steps."""
    spg = generation_steps(a, world_size)
    if spg % a.gradient_accumulation_steps:
        raise ConfigError(f"GRPOConfig steps_per_generation={spg} is not a multiple of gradient_accumulation_steps="
                          f"{a.gradient_accumulation_steps}; make it one (a generation batch must feed whole optimizer steps)")
    return spg // a.gradient_accumulation_steps


def batch_fields(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    per_step = a.per_device_train_batch_size * generation_steps(a, ctx["world_size"]) * ctx["world_size"]
    if per_step % a.num_generations:
        raise ConfigError(f"the generation batch of per_device_train_batch_size * steps_per_generation * processes = {per_step} "
                          f"completions is not a multiple of num_generations={a.num_generations}; make it one")
    return {"train.prompts_per_step": per_step // a.num_generations, "train.micro_batch_size": a.per_device_train_batch_size,
            "train.updates_per_batch": updates_per_round(a, ctx["world_size"])}


def steps_per_epoch(a: GRPOConfig, num_rows: int, world_size: int) -> int:
    """TRL steps in one pass over ``num_rows`` prompts, as transformers counts them on TRL's dataloader: its
    RepeatSampler keeps whole generation batches only (num_rows // prompts per batch of them), each feeding
    num_iterations * steps_per_generation / gradient_accumulation_steps optimizer updates (at least 1)."""
    prompts = a.per_device_train_batch_size * generation_steps(a, world_size) * world_size // a.num_generations
    return max(1, num_rows // max(1, prompts) * a.num_iterations * updates_per_round(a, world_size))


def trl_max_steps(a: GRPOConfig, ctx: dict) -> int:
    """TRL's run length in its steps: max_steps, or ceil(num_train_epochs * steps per epoch) (transformers)."""
    if a.max_steps > 0:
        return a.max_steps
    return math.ceil(a.num_train_epochs * steps_per_epoch(a, ctx["num_rows"], ctx["world_size"]))


def steps_fields(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    per_round = a.num_iterations * updates_per_round(a, ctx["world_size"])  # TRL steps (optimizer updates) per sampled batch
    return {"train.steps": math.ceil(trl_max_steps(a, ctx) / per_round)}


def epoch_rounds(a: GRPOConfig, ctx: dict) -> int:
    """grpokit steps (sampling rounds) in one of TRL's epochs: whole rounds, since an epoch holds whole generation batches."""
    return max(1, steps_per_epoch(a, ctx["num_rows"], ctx["world_size"]) // (a.num_iterations * updates_per_round(a, ctx["world_size"])))
