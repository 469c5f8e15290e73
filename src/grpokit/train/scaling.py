"""The Trainer's scaling hooks in one place: LoRA reference, mixed precision, data parallel, engines.

Each function here is a few lines the loop in train.py calls at one point; keeping them out of the
loop keeps train.py readable top to bottom. None of them holds math: the TIS weights live in
tis.py, the distributed reductions in distributed.py, the adapters in lora.py.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from . import lora
from grpokit.config.sections import Config, ConfigError
from .distributed import DistContext
from .models import autocast_context, resolve_autocast
from grpokit.rollout.lockstep import lockstep
from grpokit.algo.tis import mismatch_mask, pad_sampling_logprobs, sampled_rows, tis_weights

if TYPE_CHECKING:
    from .loop import Trainer


def apply_memory_plan(tr: Trainer):
    """Choose activation checkpointing and reference offload (memory.py) and apply them; one line
    says what and why when something was chosen. ``train.memory_plan="manual"``: nothing changes.
    Returns ``(plan, tokens per micro-batch of the update)`` (0: no cap; FSDP ranks take none)."""
    from .memory import MemoryPlan, plan_memory
    from .models import enable_checkpointing
    from .update import activation_memory_mb, per_token_bytes, token_budget

    cfg, model = tr.cfg, tr.model
    t = cfg.train
    budget = lambda plan: 0 if t.fsdp else token_budget(model.config, activation_memory_mb(t.activation_memory_mb, tr.device),
                                                        next(model.parameters()).element_size(), t.micro_batch_tokens,
                                                        plan.checkpointing)
    if t.memory_plan == "manual" or t.fsdp:
        plan = MemoryPlan(cfg.model.gradient_checkpointing, False, [])
        return plan, budget(plan)
    params = list(model.parameters())
    value = params[0].element_size()
    rows = cfg.train.micro_batch_size or cfg.train.prompts_per_step // tr.dist.world_size * cfg.rollout.group_size
    max_len = max((len(p.ids) for p in tr.prompts), default=0) + cfg.rollout.max_new_tokens
    device_bytes = torch.cuda.get_device_properties(tr.device).total_memory if tr.device.type == "cuda" else 0
    plan = plan_memory(per_token_bytes=0 if cfg.model.gradient_checkpointing else per_token_bytes(model.config, value),
                       checkpointed_token_bytes=per_token_bytes(model.config, value, checkpointed=True),
                       budget_mb=activation_memory_mb(cfg.train.activation_memory_mb, tr.device), rows=rows, max_len=max_len,
                       param_bytes=sum(p.numel() * p.element_size() for p in params),
                       trainable_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
                       reference_copy=tr.ref_model is not None, device_bytes=device_bytes)
    if plan.checkpointing:
        enable_checkpointing(model)
    if plan.offload_reference:
        tr.ref_model.to("cpu")
    if plan.reasons and tr.dist.is_main:
        print(plan.line(), flush=True)
    plan.checkpointing = plan.checkpointing or cfg.model.gradient_checkpointing
    return plan, budget(plan)


def check_world(cfg: Config, ctx: DistContext) -> None:
    """Settings that cannot work with ``ctx.world_size`` ranks, each as one sentence."""
    t, k = cfg.train, ctx.world_size
    if t.fsdp and not torch.distributed.is_initialized():
        raise ConfigError("train.fsdp=true needs a process group; launch with torchrun --nproc_per_node N "
                          "(N = 1 runs FSDP on one GPU, to try it)")
    if k == 1:
        return
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


def sampling_model(tr: Trainer):
    """A context giving the model to sample with: the model itself, or under FSDP a stand-in that
    keeps every rank's forward passes in step (rollout/lockstep.py says why)."""
    if not tr.dist.fsdp:
        return contextlib.nullcontext(tr.model)
    return lockstep(tr.model, tr.dist.any_rank)


def uses_tis(cfg: Config) -> bool:
    """TIS applies when the sampler is not the trainer's own forward: vLLM, or stale async samples."""
    r = cfg.rollout
    return r.tis_cap > 0 and (r.backend != "hf" or r.async_staleness > 0)


def corrects_mismatch(cfg: Config) -> bool:
    """The loss is corrected for the sampler (TIS or mismatch masking), so pi_old is computed first."""
    return uses_tis(cfg) or cfg.rollout.mismatch_mask != "none"


def sampler_logprobs(rollout, batch) -> torch.Tensor:
    """``(N, T)`` the sampler's logprobs of the batch's completion tokens, 0 where it gave none."""
    return pad_sampling_logprobs(rollout.sampling_logprobs, batch.width).to(batch.completion_mask.device)


def sampler_mask(rollout, batch) -> torch.Tensor:
    """``(N, T)`` tokens whose sampler logprob is real: the model's tokens of rows the sampler scored."""
    return batch.completion_mask * sampled_rows(rollout.sampling_logprobs).to(batch.completion_mask)[:, None]


def mismatch_inputs(r, rollout, batch) -> dict[str, Any]:
    """``UpdateInputs`` fields that make the update measure the sampler/trainer mismatch."""
    return {"sampler_logp": sampler_logprobs(rollout, batch), "sampler_mask": sampler_mask(rollout, batch),
            "mismatch_bounds": (r.mismatch_low, r.mismatch_high)}


def corrected_advantages(cfg: Config, advantages: torch.Tensor, old_logp, rollout, batch):
    """Per-token advantages with TIS weights and the mismatch mask applied, and their metrics."""
    r, metrics = cfg.rollout, {}
    adv_NT = advantages[:, None] if advantages.dim() == 1 else advantages
    if uses_tis(cfg):
        adv_NT, metrics = tis_advantages(advantages, old_logp, rollout, batch, r.tis_cap)
    if r.mismatch_mask != "none":  # IcePop / MIS: tokens or rows the sampler disagrees on leave the gradient
        keep_NT, m = mismatch_mask(old_logp, sampler_logprobs(rollout, batch), sampler_mask(rollout, batch),
                                   r.mismatch_mask, r.mismatch_low, r.mismatch_high)
        adv_NT, metrics = adv_NT * keep_NT.to(adv_NT.device), {**metrics, **m}
    return adv_NT, metrics


def reference_logprobs(tr: Trainer, batch) -> torch.Tensor:
    """log pi_ref of the batch: the frozen copy, or (LoRA) the same model with adapters disabled."""
    if tr.ref_model is not None and tr.memory_plan.offload_reference:  # kept on CPU between its passes
        tr.ref_model.to(tr.device)
        try:
            return tr._logprobs(tr.ref_model, batch)[0]
        finally:
            tr.ref_model.to("cpu")
    if tr.ref_model is not None:
        return tr._logprobs(tr.ref_model, batch)[0]
    return lora.reference_logprobs(tr.model, lambda: tr._logprobs(tr.model, batch)[0])


def tis_advantages(advantages: torch.Tensor, old_logp, rollout, batch, cap: float):
    """Per-token advantages ``w_NT * A`` with TIS weights (see tis.py for why this is the TIS loss)."""
    sampler = pad_sampling_logprobs(rollout.sampling_logprobs, batch.width).to(old_logp.device)
    w_NT, metrics = tis_weights(old_logp, sampler, batch.completion_mask, cap)
    adv_NT = advantages[:, None] if advantages.dim() == 1 else advantages
    return adv_NT * w_NT, metrics


def next_prompts(tr: Trainer, n: int, group_size: int):
    """``(prompts, rollout or None)``: an async prefetch, or this rank's slice of the next prompts."""
    if tr.engine is not None and getattr(tr.engine, "prefetches", False):
        return tr.engine.next_rollout(n, group_size)
    k, w = tr.dist.rank, tr.dist.world_size
    return tr.sampler.next_batch(n * w)[k * n:(k + 1) * n], None  # same draw on every rank


def make_engine(tr: Trainer):
    """The rollout engine for ``rollout.backend`` / ``rollout.async_staleness`` (None: the hf loop)."""
    r = tr.cfg.rollout
    if r.backend in ("vllm", "vllm_server"):
        from grpokit.rollout.vllm import make_vllm_engine

        return make_vllm_engine(tr)
    if r.async_staleness > 0:
        from grpokit.rollout.async_ import AsyncRollout

        return AsyncRollout(tr, r.async_staleness)
    return None


# ---------------------------------------------------------------- checkpoints


def checkpoint_writers(tr: Trainer) -> dict[str, Any]:
    """Keyword arguments for ``checkpoint.save``; collective parts run on every rank."""
    hooks: dict[str, Any] = {}
    states = tr.dist.gather_objects(tr.generator.get_state())
    if tr.dist.active:
        hooks["sampler_states"] = states
    if tr.dist.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(tr.model, options=opts)  # collective: every rank gathers, rank 0 keeps
        hooks["optimizer_state"] = get_optimizer_state_dict(tr.model, tr.optimizer, options=opts)
        hooks["write_model"] = lambda model, out: model.save_pretrained(out / "model", state_dict=full, safe_serialization=True)
    elif tr.cfg.model.lora_rank:
        hooks["write_model"] = lambda model, out: lora.save_model(model, out, tr.cfg.model.lora_save)
    return hooks


def checkpoint_loaders(tr: Trainer) -> dict[str, Any]:
    """Keyword arguments for ``checkpoint.load``: every rank reads the whole checkpoint and keeps its part."""
    if tr.cfg.model.lora_rank:
        return {"read_model": lambda model, path: lora.load_adapter(model, Path(path))}
    if tr.dist.fsdp:
        return {"read_model": _fsdp_read_model,
                "load_optimizer": lambda optimizer, state: _fsdp_load_optimizer(tr.model, optimizer, state)}
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
