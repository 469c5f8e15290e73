"""Which parameters weight decay reaches: all of them (grpokit's default), or transformers' Trainer's
two groups, decayed and not (``optim.decay_norms_and_biases=false``, what a TRL script gets).

transformers (``Trainer.get_decay_parameter_names``, 5.x) leaves out of the decay every parameter that
lies inside an ``nn.LayerNorm`` module (a module type, checked on every module of the parameter's path
below the model itself) and every parameter whose lower-cased name contains ``bias`` / ``layernorm`` /
``rmsnorm``, or has ``norm`` or ``..._norm`` as a whole dotted part. RMSNorm weights are caught by their
names (``input_layernorm``, ``model.norm``), not by type, in transformers as here. The groups come in
transformers' order: decayed first, then the rest with weight decay 0 (both present even when empty).
"""

from __future__ import annotations

import re

import torch

_NO_DECAY_NAME = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")
_NO_DECAY_TYPES = (torch.nn.LayerNorm,)  # transformers' forbidden layer types, exactly


def decays(model: torch.nn.Module, name: str) -> bool:
    """Whether transformers' Trainer decays the parameter ``name`` of ``model``: not inside a LayerNorm
    module (the model itself not counted, as transformers), and no norm or bias in its name."""
    parts = name.split(".")[:-1]
    inside = (model.get_submodule(".".join(parts[: i + 1])) for i in range(len(parts)))
    if any(isinstance(m, _NO_DECAY_TYPES) for m in inside):
        return False
    return _NO_DECAY_NAME.search(name.lower()) is None


def param_groups(model: torch.nn.Module, weight_decay: float, decay_norms_and_biases: bool) -> list[dict]:
    """The optimizer's parameter groups over ``model``'s trainable parameters: one group at
    ``weight_decay`` when ``decay_norms_and_biases`` (or when ``weight_decay`` is 0), else transformers' two
    (decayed at ``weight_decay``, the others at 0)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if decay_norms_and_biases or weight_decay == 0:  # no decay anywhere: one group is the same update (and it
        # keeps the optimizer state of a checkpoint saved with one group loadable)
        return [{"params": [p for _, p in named], "weight_decay": weight_decay}]
    decayed = [decays(model, n) for n, _ in named]
    return [
        {"params": [p for (_, p), d in zip(named, decayed) if d], "weight_decay": weight_decay},
        {"params": [p for (_, p), d in zip(named, decayed) if not d], "weight_decay": 0.0},
    ]
