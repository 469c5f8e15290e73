"""How a checkpoint writes and reads the model and optimizer under LoRA (adapters only) and FSDP
(gathered to rank 0 on save, every rank keeping its shard on load), and every rank's sampler state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from . import lora
from .distributed import DistContext


def checkpoint_writers(model, optimizer, generator: torch.Generator, dist: DistContext, m) -> dict[str, Any]:
    """Keyword arguments for ``checkpoint.save`` (``m``: the model section); collective parts run on every rank."""
    hooks: dict[str, Any] = {}
    states = dist.gather_objects(generator.get_state())
    if dist.active:
        hooks["sampler_states"] = states
    if dist.fsdp:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(model, options=opts)  # collective: every rank gathers, rank 0 keeps
        hooks["optimizer_state"] = get_optimizer_state_dict(model, optimizer, options=opts)
        hooks["write_model"] = lambda model, out: model.save_pretrained(
            out / "model", state_dict=full, safe_serialization=True
        )
    elif m.lora_rank:
        hooks["write_model"] = lambda model, out: lora.save_model(model, out, m.lora_save)
    return hooks


def checkpoint_loaders(model, dist: DistContext, m) -> dict[str, Any]:
    """Keyword arguments for ``checkpoint.load`` (``m``: the model section): every rank reads the whole
    checkpoint and keeps its part."""
    if m.lora_rank:
        return {"read_model": lambda model, path: lora.load_adapter(model, Path(path), m.lora_target_modules)}
    if dist.fsdp:
        return {
            "read_model": _fsdp_read_model,
            "load_optimizer": lambda optimizer, state: _fsdp_load_optimizer(model, optimizer, state),
        }
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
