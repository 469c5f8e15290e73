"""Which layers get LoRA adapters: ``model.lora_target_modules`` made into PEFT's ``target_modules``.

PEFT reads a list of names literally: a module is adapted when its name is one of them or ends in
``.name``, and a name that matches nothing is dropped without a word as long as another name matches
(``[q_proj, qproj_typo]`` trains q_proj alone). PEFT's ``"all-linear"`` works only alone, as the
string: inside a list it is one more name that matches nothing (``[all-linear, lm_head]`` adapts
lm_head alone). grpokit reads the list as meant:

* ``[all-linear]``: every linear layer but the output layer (PEFT's shorthand; a vision-language model's
  language-model layers only while ``model.freeze_vision`` holds, its frozen vision tower keeps none);
* ``[all-linear, name ...]``: those layers and the named ones (``[all-linear, lm_head]`` adds the head);
* a name that matches no module of the model is refused, naming it and the model's linear layers.

With no list at all (a ``peft.LoraConfig`` without ``target_modules``), PEFT adapts the model type's
own default layers (llama: q_proj and v_proj; PEFT's ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``)
and refuses a model type it has no default for; ``default_targets`` reads the same table.
"""

from __future__ import annotations

import re

import torch

from grpokit.config.sections import ConfigError

ALL_LINEAR = "all-linear"

# Every linear layer of the decoder of a vision-language model (a PEFT regex on module names); the
# vision tower's layers (Qwen2-VL: qkv, proj, fc1, fc2 under "visual") get no adapter.
LANGUAGE_LINEARS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def default_targets(model_type: str) -> list[str]:
    """PEFT's default LoRA layers for ``model_type`` (what a ``LoraConfig`` without ``target_modules``
    adapts), refused as PEFT refuses it for a model type PEFT has no default for."""
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    names = DEFAULTS.get(model_type)
    if names is None:
        raise ConfigError(
            f"peft_config.target_modules is None and PEFT has no default LoRA layers for model type {model_type!r} "
            "(PEFT: 'Please specify `target_modules` in `peft_config`'); give target_modules, e.g. 'all-linear' "
            "or the layer names such as ['q_proj', 'v_proj']"
        )
    return [names] if isinstance(names, str) else sorted(names)


def peft_targets(model, targets: list[str], language_only: bool = True) -> str | list[str]:
    """PEFT's ``target_modules`` for ``model.lora_target_modules`` = ``targets`` (the module docstring's
    rules); every name must match a module of ``model``. ``language_only`` (``model.freeze_vision``): a
    vision-language model's all-linear leaves out its frozen vision tower; without it all-linear is PEFT's
    own, the tower's layers included (as TRL, which freezes nothing)."""
    names = [t for t in targets if t != ALL_LINEAR]
    modules = [n for n, _ in model.named_modules()]
    unmatched = [t for t in names if not any(m == t or m.endswith("." + t) for m in modules)]
    if unmatched:
        hint = " (all-linear is spelt with a hyphen)" if "all_linear" in unmatched else ""
        raise ConfigError(
            f"model.lora_target_modules={list(targets)!r}: {', '.join(map(repr, unmatched))} names no module of "
            f"this model{hint}; its linear layers are {linear_names(model)} (or [all-linear] for all of them)"
        )
    vision = language_only and getattr(model.config, "vision_config", None) is not None
    if ALL_LINEAR not in targets:
        return names
    if vision:  # adapters on the language model only (VLM-R1), plus the named layers
        extra = "|".join(re.escape(n) for n in names)
        return LANGUAGE_LINEARS + (rf"|(.*\.)?({extra})" if names else "")
    return ALL_LINEAR if not names else sorted(set(linear_names(model)) | set(names))


def linear_names(model) -> list[str]:
    """The names (last part) of the model's linear layers but its output layer: what all-linear adapts."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    kinds = (torch.nn.Linear, Conv1D)
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, kinds) and m is not head})
