"""LoRA and QLoRA through PEFT: train small adapters, keep the base frozen, use the base as reference.

Why LoRA fits GRPO well. The KL term needs a reference policy; full fine-tuning keeps a second copy of
every weight for it. With fresh adapters the reference *is* the frozen base, reached by switching the
adapters off for one forward pass (``with model.disable_adapter():``), so no copy exists at all. A run
that starts from a trained adapter (a PeftModel given as the model) has that adapter as its reference,
as TRL: ``StartingAdapter`` keeps a copy of its tensors, the adapter's size, for the reference pass.
Which layers get adapters is lora_targets.py's.

Checkpoints. ``model/`` holds what ``model.lora_save`` asks for:

* ``"adapter"``: the PEFT adapter alone (``adapter_config.json`` + ``adapter_model.safetensors``),
  loadable with ``PeftModel.from_pretrained(base, path)``;
* ``"merged"``: a plain Hugging Face model with ``W + (alpha/r) B A`` folded in, loadable with
  ``AutoModelForCausalLM.from_pretrained``; the adapter is written beside it in ``adapter/`` because
  resume needs the exact adapter weights (merging rounds, un-merging would not give them back). Tied
  embeddings with an adapter on either end are untied first (``merge_adapters``).

QLoRA (Dettmers et al., 2023) loads the frozen base in 4-bit NF4 with bitsandbytes; it needs CUDA.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import torch

from grpokit.config.sections import ConfigError, ModelConfig

from .lora_targets import peft_targets


def quantization_config(cfg: ModelConfig, device: torch.device, compute_dtype: torch.dtype):
    """The ``BitsAndBytesConfig`` for QLoRA, or None; a clear error where it cannot work."""
    if cfg.quantization == "none":
        return None
    if device.type != "cuda":
        raise ConfigError(
            f"model.quantization={cfg.quantization!r} needs a CUDA GPU (bitsandbytes 4-bit kernels), "
            f"but the device is {device.type}; use model.quantization=none on this machine"
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"model.quantization={cfg.quantization!r} needs the bitsandbytes package; "
            "pip install bitsandbytes, or use model.quantization=none"
        ) from None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def add_adapters(model, cfg: ModelConfig):
    """Wrap ``model`` in a PEFT model with fresh LoRA adapters; only adapter parameters train.

    LoRA's B starts at zero, so the wrapped policy computes exactly what the base computes until
    the first update (tests/train/test_lora.py checks it).
    """
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg.quantization != "none":  # QLoRA: fp32 norms, input grads for checkpointing
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
    targets = cfg.lora_target_modules
    # all-linear with names expanded, a name matching nothing refused; the vision tower only when not frozen
    target = peft_targets(model, targets, language_only=cfg.freeze_vision)
    lcfg = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=target,
        task_type="CAUSAL_LM",
        bias="none",
    )
    try:
        peft_model = get_peft_model(model, lcfg)
    except ValueError as e:
        raise ConfigError(
            f"model.lora_target_modules={targets!r} matches no layer of this model ({e}); "
            "use [all-linear] or names such as [q_proj, v_proj]"
        ) from None
    if cfg.gradient_checkpointing:
        # The frozen embeddings produce outputs without grad; checkpointed blocks need an input that
        # requires grad, or their adapters receive none.
        peft_model.enable_input_require_grads()
    return peft_model


def reference_logprobs(model, fn):
    """Run ``fn()`` with the adapters disabled: the base model is the reference policy."""
    with model.disable_adapter():
        return fn()


def adapter_tensors(model) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, tensor) of every tensor of the active adapter (LoRA's A and B, DoRA's magnitudes, a
    ``modules_to_save`` copy): the parameters PEFT names ``...<adapter>.weight`` or, on an embedding,
    ``...lora_embedding_A.<adapter>``."""
    name = getattr(model, "active_adapter", "default")
    return [(n, p) for n, p in model.named_parameters() if f".{name}." in n or n.endswith(f".{name}")]


def at_base(model) -> bool:
    """Whether the adapters compute exactly what the base computes: plain LoRA layers (A and B alone) whose
    product B A is zero because A or B is (PEFT starts a linear layer's B and an embedding's A at zero, as
    ``add_adapters`` does); a trained adapter, or any other adapter tensor, is not at the base."""
    vanishes: dict[str, bool] = {}  # layer -> A or B is all zeros
    for name, p in adapter_tensors(model):
        found = re.search(r"^(.*)\.lora_(embedding_)?[AB]\.", name)
        if found is None:  # DoRA's magnitude, a modules_to_save copy: not a plain LoRA pair
            return False
        zero = not bool(p.detach().ne(0).any())
        vanishes[found.group(1)] = vanishes.get(found.group(1), False) or zero
    return all(vanishes.values())


class StartingAdapter:
    """The adapter a LoRA run started from, kept as its KL reference when it is not at the base (a trained
    adapter given as the model): the reference pass copies these tensors into the adapter and puts the
    trained ones back after it. TRL keeps the same reference as a frozen second adapter ("ref"); one
    copy of the adapter's tensors costs as much and leaves the model with one adapter, so saving, merging,
    weight sync and sampling snapshots are unchanged."""

    def __init__(self, model):
        self.tensors = [p for _, p in adapter_tensors(model)]
        self.start = [p.detach().clone() for p in self.tensors]  # after FSDP: each rank's own shards

    def run(self, fn):
        """``fn()`` (a no-grad forward pass) with the starting adapter in the trained one's place."""
        with torch.no_grad():
            trained = [p.detach().clone() for p in self.tensors]
            for p, s in zip(self.tensors, self.start):
                p.copy_(s)
        try:
            return fn()
        finally:
            with torch.no_grad():
                for p, t in zip(self.tensors, trained):
                    p.copy_(t)


def tied_and_adapted(model) -> bool:
    """Whether the PEFT model's output layer shares its weight with the input embeddings (tied embeddings,
    as Qwen2.5-0.5B and SmolLM2) while one of the two carries an adapter: then the two ends compute with
    different weights, which a merge into the one shared weight cannot hold."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    inner = model.get_base_model()
    head, embed = inner.get_output_embeddings(), inner.get_input_embeddings()
    if head is None or embed is None or not (isinstance(head, BaseTunerLayer) or isinstance(embed, BaseTunerLayer)):
        return False
    return getattr(head, "base_layer", head).weight is getattr(embed, "base_layer", embed).weight


def merge_adapters(model):
    """The base with the adapters folded in (``W + (alpha/r) B A``), computing what ``model`` computes.
    Tied embeddings with an adapter on either end (``tied_and_adapted``) are untied first, so the merge
    changes only the adapted one; PEFT's merge would write the head's update into the shared weight and so
    into the embeddings too (or the embeddings' into the head)."""
    if tied_and_adapted(model):
        inner = model.get_base_model()
        head, embed = inner.get_output_embeddings(), inner.get_input_embeddings()
        weight = getattr(embed, "base_layer", embed).weight
        getattr(head, "base_layer", head).weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
        for config in {id(c): c for c in (inner.config, inner.config.get_text_config())}.values():
            config.tie_word_embeddings = False  # the saved model loads its own head
    return model.merge_and_unload()


def save_model(model, out: Path, mode: str) -> None:
    """Write ``out/model`` (adapter or merged model) and, when merged, ``out/adapter``."""
    if mode == "merged":
        model.save_pretrained(out / "adapter", safe_serialization=True)
        merged = merge_adapters(copy.deepcopy(model))  # a copy: the live model keeps its adapters
        merged.save_pretrained(out / "model", safe_serialization=True)
        del merged
    else:
        model.save_pretrained(out / "model", safe_serialization=True)


def load_adapter(model, ckpt: Path, targets: list[str]) -> None:
    """Load the adapter weights of a checkpoint into the live PEFT model (exactly, for resume); a checkpoint
    whose adapters are not the model's (other layers, another rank) is refused naming model.lora_*."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = ckpt / "adapter" if (ckpt / "adapter").is_dir() else ckpt / "model"
    f = folder / "adapter_model.safetensors"
    if not f.exists():
        raise ConfigError(
            f"checkpoint {str(ckpt)!r} has no adapter_model.safetensors; it was not written by a LoRA run "
            "(resume with the model.lora_rank it was trained with)"
        )
    device = next(model.parameters()).device
    saved = load_file(str(f), device=str(device))
    check_adapter_match(get_peft_model_state_dict(model), saved, ckpt, targets)
    set_peft_model_state_dict(model, saved)


def check_adapter_match(own: dict, saved: dict, ckpt: Path, targets: list[str]) -> None:
    """The checkpoint's adapter tensors ``saved`` are the live adapter's ``own``: the same layers (else
    model.lora_target_modules differs from the run's) and the same shapes (else model.lora_rank does)."""
    missing, extra = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or extra:
        what = "; ".join(
            f"{word} adapters on {sorted({_layer_of(k) for k in keys})}"
            for word, keys in (("it has no", missing), ("it holds", extra))
            if keys
        )
        raise ConfigError(
            f"checkpoint {str(ckpt)!r} does not match the adapters of model.lora_target_modules={list(targets)!r}: "
            f"{what}; resume with the model.lora_target_modules the run was trained with (its config.yaml)"
        )
    shapes = [(k, tuple(saved[k].shape), tuple(own[k].shape)) for k in own if saved[k].shape != own[k].shape]
    if shapes:
        k, theirs, mine = shapes[0]
        raise ConfigError(
            f"checkpoint {str(ckpt)!r} does not match the adapters: {k} has shape {theirs} there and {mine} here; "
            "resume with the model.lora_rank the run was trained with (its config.yaml)"
        )


def _layer_of(key: str) -> str:
    """The layer an adapter tensor's key belongs to (``...self_attn.q_proj.lora_A.weight``: q_proj)."""
    found = re.search(r"([^.]+)\.(lora_|modules_to_save)", key)
    return found.group(1) if found else key
