"""The Trainer's scaling hooks in one place: LoRA reference, mixed precision, data parallel, engines.

Each function here is a few lines the loop (train/loop.py) calls at one point; keeping them out of
the loop keeps it readable top to bottom. Each takes the few objects it needs (model, sampling
settings, device, distributed context, config sections), never the Trainer, so an engine or a
checkpoint hook can be built and tested without one. None of them holds math: the TIS weights live
in algo/tis.py, the distributed reductions in distributed.py, the adapters in lora.py.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

import torch

from . import lora
from grpokit.config.sections import Config, ConfigError
from .distributed import DistContext, rank_seed
from .models import autocast_context, resolve_autocast
from grpokit.rollout.lockstep import lockstep


def apply_memory_plan(cfg: Config, model, ref_model, device: torch.device, dist: DistContext, max_prompt_len: int):
    """Choose activation checkpointing and reference offload (memory.py) and apply them; one line
    says what and why when something was chosen. ``train.memory_plan="manual"``: nothing changes.
    ``max_prompt_len``: the longest prompt's token count. Returns ``(plan, tokens per micro-batch of
    the update)`` (0: no cap; FSDP ranks take none)."""
    from .memory import MemoryPlan, plan_memory
    from .models import enable_checkpointing
    from .update import activation_memory_mb, per_token_bytes, token_budget

    t = cfg.train
    budget = lambda plan: 0 if t.fsdp else token_budget(model.config, activation_memory_mb(t.activation_memory_mb, device),
                                                        next(model.parameters()).element_size(), t.micro_batch_tokens,
                                                        plan.checkpointing)
    if t.memory_plan == "manual" or t.fsdp:
        plan = MemoryPlan(cfg.model.gradient_checkpointing, False, [])
        return plan, budget(plan)
    params = list(model.parameters())
    value = params[0].element_size()
    rows = t.micro_batch_size or t.prompts_per_step // dist.world_size * cfg.rollout.group_size
    max_len = max_prompt_len + cfg.rollout.max_new_tokens
    device_bytes = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
    plan = plan_memory(per_token_bytes=0 if cfg.model.gradient_checkpointing else per_token_bytes(model.config, value),
                       checkpointed_token_bytes=per_token_bytes(model.config, value, checkpointed=True),
                       budget_mb=activation_memory_mb(t.activation_memory_mb, device), rows=rows, max_len=max_len,
                       param_bytes=sum(p.numel() * p.element_size() for p in params),
                       trainable_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
                       reference_copy=ref_model is not None, device_bytes=device_bytes)
    if plan.checkpointing:
        enable_checkpointing(model)
    if plan.offload_reference:
        ref_model.to("cpu")
        ref_model.grpokit_offloaded = True  # scaling.reference_logprobs moves it in for its pass
    if plan.reasons and dist.is_main:
        print(plan.line(), flush=True)
    plan.checkpointing = plan.checkpointing or cfg.model.gradient_checkpointing
    return plan, budget(plan)


def check_world(cfg: Config, ctx: DistContext) -> None:
    """Settings that cannot work with ``ctx.world_size`` ranks, each as one sentence."""
    t, k = cfg.train, ctx.world_size
    if t.fsdp and not torch.distributed.is_initialized():
        raise ConfigError("train.fsdp=true needs a process group; launch with torchrun --nproc_per_node N "
                          "(N = 1 runs FSDP on one GPU, to try it)")
    tp = cfg.rollout.vllm_tensor_parallel_size
    if k % tp:  # also with one process: a group of tp ranks needs tp processes
        raise ConfigError(f"rollout.vllm_tensor_parallel_size={tp} must divide the {k} ranks (one engine per group of {tp} "
                          f"consecutive ranks); use one of: {', '.join(str(d) for d in range(1, k + 1) if k % d == 0)}")
    if k == 1:
        return
    if t.accumulation_slices > 1:  # a pending update's gradient is per rank until it is applied
        raise ConfigError(f"train.accumulation_slices={t.accumulation_slices} runs on one process only, not {k} ranks; "
                          "set it to 1")
    if t.prompts_per_step % k:
        raise ConfigError(f"train.prompts_per_step={t.prompts_per_step} must be divisible by the {k} ranks "
                          f"(each rank keeps whole groups); use a multiple of {k}")
    if cfg.rollout.async_staleness:
        raise ConfigError("rollout.async_staleness > 0 is not supported with several ranks yet; set it to 0")


def autocast_factory(m, device: torch.device, model: torch.nn.Module):
    """A no-argument function returning the autocast context of every forward (or a no-op)."""
    weight_dtype = next(model.parameters()).dtype
    dtype = resolve_autocast(m, device, weight_dtype)
    return lambda: autocast_context(device, dtype)


def sampling_model(model, dist: DistContext):
    """A context giving the model to sample with: the model itself, or under FSDP a stand-in that
    keeps every rank's forward passes in step (rollout/lockstep.py says why)."""
    if not dist.fsdp:
        return contextlib.nullcontext(model)
    return lockstep(model, dist.any_rank)


def uses_tis(cfg: Config) -> bool:
    """TIS applies when the sampler is not the trainer's own forward: vLLM, or stale async samples."""
    r = cfg.rollout
    return r.tis_cap > 0 and (r.backend != "hf" or r.async_staleness > 0)


def reference_logprobs(model, ref_model, batch, logprobs: Callable) -> torch.Tensor:
    """log pi_ref of the batch: the frozen copy ``ref_model``, or (LoRA, ``ref_model`` None) the
    policy ``model`` with adapters disabled; ``logprobs(model, batch)`` is the loop's no-grad pass."""
    if ref_model is not None and getattr(ref_model, "grpokit_offloaded", False):  # on CPU between its passes
        ref_model.to(batch.input_ids.device)
        try:
            return logprobs(ref_model, batch)[0]
        finally:
            ref_model.to("cpu")
    if ref_model is not None:
        return logprobs(ref_model, batch)[0]
    return lora.reference_logprobs(model, lambda: logprobs(model, batch)[0])


def next_prompts(engine, sampler, dist: DistContext, n: int, group_size: int):
    """``(prompts, rollout or None)``: an async prefetch, or this rank's slice of the next prompts."""
    if engine is not None and getattr(engine, "prefetches", False):
        return engine.next_rollout(n, group_size)
    k, w = dist.rank, dist.world_size
    return sampler.next_batch(n * w)[k * n:(k + 1) * n], None  # same draw on every rank


def make_engine(cfg: Config, model, step: int, params, device: torch.device, dist: DistContext, run_dir: Path,
                async_source: tuple[Callable, Callable] | None = None):
    """The rollout engine for ``rollout.backend`` / ``rollout.async_staleness`` (None: the hf loop),
    holding the policy ``model`` after ``step`` updates. ``async_source`` is ``(sample, next_batch)``
    for the async sampler (rollout/async_.py says what each does)."""
    r = cfg.rollout
    if r.backend == "vllm_server":
        from grpokit.data.vision import image_token_id
        from grpokit.rollout.vllm_client import make_server_engine

        engine = make_server_engine(r, params, run_dir, dist, lora=bool(cfg.model.lora_rank), image_token_id=image_token_id(model))
        engine.after_update(model, step)  # the server starts from the base checkpoint: push the policy once
        return engine
    if r.backend == "vllm":
        engine = colocated_engine(cfg, params, device, dist)
        if step:  # resumed: the engine loaded the base checkpoint, the policy has moved on
            engine.after_update(model, step)
        return engine
    if r.async_staleness > 0:
        from grpokit.rollout.async_ import AsyncRollout

        sample, next_batch = async_source
        return AsyncRollout(model, step, sample, next_batch, prompts_per_step=cfg.train.prompts_per_step,
                            group_size=r.group_size, max_staleness=r.async_staleness, device=device, seed=cfg.train.seed)
    return None


def colocated_engine(cfg: Config, params, device: torch.device, dist: DistContext):
    """``rollout.backend=vllm``: one engine per rank, or one per group of ``rollout.vllm_tensor_parallel_size``
    ranks (rollout/vllm_tp.py). Its seed is the group's, as TRL's (the shards of an engine must sample the same
    tokens), mixed as the hf engine's rank seeds: group 0 (and so a one-process run) keeps the plain seed."""
    r = cfg.rollout
    seed = rank_seed(cfg.train.seed, dist.rank // r.vllm_tensor_parallel_size)
    if r.vllm_tensor_parallel_size > 1:
        from grpokit.rollout.vllm_tp import make_tensor_parallel_engine

        return make_tensor_parallel_engine(r, cfg.model, params, device, seed, dist)
    from grpokit.rollout.vllm import make_colocated_engine

    return make_colocated_engine(r, cfg.model, params, device, seed)


# ---------------------------------------------------------------- checkpoints


def checkpoint_writers(model, optimizer, generator: torch.Generator, dist: DistContext, m) -> dict[str, Any]:
    """Keyword arguments for ``checkpoint.save`` (``m``: the model section); collective parts run on every rank."""
    hooks: dict[str, Any] = {}
    states = dist.gather_objects(generator.get_state())
    if dist.active:
        hooks["sampler_states"] = states
    if dist.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(model, options=opts)  # collective: every rank gathers, rank 0 keeps
        hooks["optimizer_state"] = get_optimizer_state_dict(model, optimizer, options=opts)
        hooks["write_model"] = lambda model, out: model.save_pretrained(out / "model", state_dict=full, safe_serialization=True)
    elif m.lora_rank:
        hooks["write_model"] = lambda model, out: lora.save_model(model, out, m.lora_save)
    return hooks


def checkpoint_loaders(model, dist: DistContext, m) -> dict[str, Any]:
    """Keyword arguments for ``checkpoint.load`` (``m``: the model section): every rank reads the whole
    checkpoint and keeps its part."""
    if m.lora_rank:
        return {"read_model": lambda model, path: lora.load_adapter(model, Path(path))}
    if dist.fsdp:
        return {"read_model": _fsdp_read_model,
                "load_optimizer": lambda optimizer, state: _fsdp_load_optimizer(model, optimizer, state)}
    return {}


def _fsdp_read_model(model, path: Path) -> None:
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    weights = {}
    for f in sorted((Path(path) / "model").glob("*.safetensors")):
        weights.update(load_file(str(f)))
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))


def _fsdp_load_optimizer(model, optimizer, state: dict) -> None:
    """The full optimizer state (keyed by parameter name, as ``get_optimizer_state_dict`` wrote it)
    is read on every rank; ``set_optimizer_state_dict`` keeps each rank's shard of every moment."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
