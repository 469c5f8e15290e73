"""Choosing and applying the run's memory plan (activation checkpointing, reference offload) and
the update's tokens per micro-batch; the planning itself is memory.py.
"""

from __future__ import annotations

import torch

from grpokit.config.sections import Config

from .distributed import DistContext
from .stages import run_values


def apply_memory_plan(cfg: Config, model, ref_model, device: torch.device, dist: DistContext, max_prompt_len: int):
    """Choose activation checkpointing and reference offload (memory.py) and apply them; one line
    says what and why when something was chosen, for the largest group size and generation length of any
    stage (train.stages). ``train.memory_plan="manual"``: nothing changes.
    ``max_prompt_len``: the longest prompt's token count. Returns ``(plan, tokens per micro-batch of
    the update)`` (0: no cap; FSDP ranks take none)."""
    from .memory import MemoryPlan, plan_memory
    from .models import enable_checkpointing
    from .token_budget import activation_memory_mb, per_token_bytes, token_budget

    t = cfg.train
    budget = lambda plan: (
        0
        if t.fsdp
        else token_budget(
            model.config,
            activation_memory_mb(t.activation_memory_mb, device),
            next(model.parameters()).element_size(),
            t.micro_batch_tokens,
            plan.checkpointing,
        )
    )
    if t.memory_plan == "manual" or t.fsdp:
        plan = MemoryPlan(cfg.model.gradient_checkpointing, False, [])
        return plan, budget(plan)
    params = list(model.parameters())
    value = params[0].element_size()
    # planned once, for the run's most demanding stage (train.stages may raise the group size or the length)
    group = max(run_values(cfg, "rollout.group_size"))
    rows = t.micro_batch_size or t.prompts_per_step // dist.world_size * group
    max_len = max_prompt_len + max(run_values(cfg, "rollout.max_new_tokens"))
    device_bytes = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
    plan = plan_memory(
        per_token_bytes=0 if cfg.model.gradient_checkpointing else per_token_bytes(model.config, value),
        checkpointed_token_bytes=per_token_bytes(model.config, value, checkpointed=True),
        budget_mb=activation_memory_mb(t.activation_memory_mb, device),
        rows=rows,
        max_len=max_len,
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        trainable_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
        reference_copy=ref_model is not None,
        device_bytes=device_bytes,
    )
    if plan.checkpointing:
        enable_checkpointing(model)
    if plan.offload_reference:
        ref_model.to("cpu")
        ref_model.grpokit_offloaded = True  # reference.reference_logprobs moves it in for its pass
    if plan.reasons and dist.is_main:
        print(plan.line(), flush=True)
    plan.checkpointing = plan.checkpointing or cfg.model.gradient_checkpointing
    return plan, budget(plan)
