"""LoRA and QLoRA through PEFT: train small adapters, keep the base frozen, use the base as reference.

Why LoRA fits GRPO well. The KL term needs a reference policy; full fine-tuning keeps a second copy of
every weight for it. With adapters the reference *is* the frozen base, reached by switching the
adapters off for one forward pass (``with model.disable_adapter():``), so no copy exists at all.

Checkpoints. ``model/`` holds what ``model.lora_save`` asks for:

* ``"adapter"``: the PEFT adapter alone (``adapter_config.json`` + ``adapter_model.safetensors``),
  loadable with ``PeftModel.from_pretrained(base, path)``;
* ``"merged"``: a plain Hugging Face model with ``W + (alpha/r) B A`` folded in, loadable with
  ``AutoModelForCausalLM.from_pretrained``; the adapter is written beside it in ``adapter/`` because
  resume needs the exact adapter weights (merging rounds, un-merging would not give them back).

QLoRA (Dettmers et al., 2023) loads the frozen base in 4-bit NF4 with bitsandbytes; it needs CUDA.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from grpokit.config.sections import ConfigError, ModelConfig


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


# Every linear layer of the decoder of a vision-language model (a PEFT regex on module names): all-linear
# while model.freeze_vision holds, so the frozen vision tower's layers (Qwen2-VL: qkv, proj, fc1, fc2 under
# "visual") get no adapter; with freeze_vision=false all-linear is PEFT's own, the tower included (as TRL).
LANGUAGE_LINEARS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def add_adapters(model, cfg: ModelConfig):
    """Wrap ``model`` in a PEFT model with fresh LoRA adapters; only adapter parameters train.

    LoRA's B starts at zero, so the wrapped policy computes exactly what the base computes until
    the first update (tests/train/test_lora.py checks it).
    """
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg.quantization != "none":  # QLoRA: fp32 norms, input grads for checkpointing
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
    targets = cfg.lora_target_modules
    target = "all-linear" if targets == ["all-linear"] else list(targets)
    if target == "all-linear" and cfg.freeze_vision and getattr(model.config, "vision_config", None) is not None:
        target = LANGUAGE_LINEARS  # vision-language models: adapters on the language model only (VLM-R1)
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


def save_model(model, out: Path, mode: str) -> None:
    """Write ``out/model`` (adapter or merged model) and, when merged, ``out/adapter``."""
    if mode == "merged":
        model.save_pretrained(out / "adapter", safe_serialization=True)
        merged = copy.deepcopy(model).merge_and_unload()  # a copy: the live model keeps its adapters
        merged.save_pretrained(out / "model", safe_serialization=True)
        del merged
    else:
        model.save_pretrained(out / "model", safe_serialization=True)


def load_adapter(model, ckpt: Path) -> None:
    """Load the adapter weights of a checkpoint into the live PEFT model (exactly, for resume)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = ckpt / "adapter" if (ckpt / "adapter").is_dir() else ckpt / "model"
    f = folder / "adapter_model.safetensors"
    if not f.exists():
        raise ConfigError(
            f"checkpoint {str(ckpt)!r} has no adapter_model.safetensors; it was not written by a LoRA run "
            "(resume with the model.lora_rank it was trained with)"
        )
    device = next(model.parameters()).device
    result = set_peft_model_state_dict(model, load_file(str(f), device=str(device)))
    if getattr(result, "unexpected_keys", None):
        raise RuntimeError(
            f"checkpoint {ckpt} does not match the adapters: unexpected {sorted(result.unexpected_keys)[:5]}"
        )
