"""TRL's ``ModelConfig`` and the helpers scripts build a model's loading options from, without TRL.

``ModelConfig`` has TRL 1.16's fields, types, defaults and choices, so ``TrlParser((ScriptArguments,
GRPOConfig, ModelConfig))`` reads the same command line and YAML as TRL's. ``get_peft_config`` turns its
LoRA fields into a ``peft.LoraConfig`` (what GRPOTrainer's ``peft_config`` takes), ``get_quantization_config``
its 4/8-bit fields into a ``transformers.BitsAndBytesConfig`` (None unless one is set; grpokit's trainer
refuses a quantization config in one sentence), ``get_kbit_device_map`` the device map TRL gave k-bit models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpokit.config.base import ConfigError

from .model_flags import PEFT_FLAGS


def _help(text: str, **extra: Any) -> dict[str, Any]:
    return {"help": text, **extra}


@dataclass
class ModelConfig:
    """The model arguments of TRL's scripts: which model, its dtype and attention, LoRA and k-bit loading."""

    model_name_or_path: str | None = field(
        default=None, metadata=_help("Hub id or local folder of the model to train.")
    )
    model_revision: str = field(default="main", metadata=_help("Branch, tag or commit of the model on the Hub."))
    dtype: str | None = field(
        default="float32",
        metadata=_help(
            "dtype the weights are loaded in ('auto': the checkpoint's own).",
            choices=["auto", "bfloat16", "float16", "float32"],
        ),
    )
    attn_implementation: str | None = field(
        default=None,
        metadata=_help(
            "Attention implementation passed to from_pretrained (e.g. 'eager', 'sdpa'; None: transformers' choice)."
        ),
    )
    use_peft: bool = field(default=False, metadata=_help("Train LoRA adapters instead of every weight."))
    lora_r: int = field(default=16, metadata=_help("LoRA rank."))
    lora_alpha: int = field(default=32, metadata=_help("LoRA scaling numerator (the update is scaled by alpha / r)."))
    lora_dropout: float = field(default=0.05, metadata=_help("Dropout on the LoRA input."))
    lora_target_modules: list[str] | None = field(
        default=None, metadata=_help("Module names that get adapters (None: PEFT's default for the architecture).")
    )
    lora_target_parameters: list[str] | None = field(
        default=None, metadata=_help("Parameter names that get adapters directly (PEFT's target_parameters).")
    )
    lora_modules_to_save: list[str] | None = field(
        default=None, metadata=_help("Modules trained in full and saved beside the adapters.")
    )
    lora_task_type: str = field(default="CAUSAL_LM", metadata=_help("PEFT task type of the adapters."))
    use_rslora: bool = field(default=False, metadata=_help("Rank-stabilised LoRA: scale by alpha / sqrt(r)."))
    use_dora: bool = field(default=False, metadata=_help("Weight-decomposed LoRA (DoRA)."))
    load_in_8bit: bool = field(default=False, metadata=_help("Load the base weights in 8 bits (bitsandbytes)."))
    load_in_4bit: bool = field(default=False, metadata=_help("Load the base weights in 4 bits (bitsandbytes)."))
    bnb_4bit_quant_type: str = field(default="nf4", metadata=_help("4-bit data type.", choices=["fp4", "nf4"]))
    use_bnb_nested_quant: bool = field(default=False, metadata=_help("Quantise the 4-bit quantisation constants too."))
    bnb_4bit_quant_storage: str | None = field(default=None, metadata=_help("dtype the 4-bit weights are stored in."))

    def __post_init__(self) -> None:
        if self.load_in_8bit and self.load_in_4bit:
            raise ConfigError("ModelConfig sets both load_in_8bit and load_in_4bit; choose one")
        # TRL's reading of a one-item list: a single name (PEFT then matches it as a regular expression)
        if isinstance(self.lora_target_modules, (list, tuple)) and len(self.lora_target_modules) == 1:
            self.lora_target_modules = self.lora_target_modules[0]


def get_peft_config(model_args: ModelConfig) -> Any:
    """A ``peft.LoraConfig`` from the LoRA fields, or None when ``use_peft`` is False."""
    if not model_args.use_peft:
        return None
    try:
        from peft import LoraConfig
    except ImportError:
        raise ConfigError("use_peft needs the peft package; install it with `pip install 'grpokit[peft]'`") from None
    kw = {field: getattr(model_args, flag) for field, flag in PEFT_FLAGS.items()}  # the one table of the flags
    if kw["target_parameters"] is None:  # a peft without the field takes none
        del kw["target_parameters"]
    return LoraConfig(bias="none", **kw)


def get_quantization_config(model_args: ModelConfig) -> Any:
    """A ``transformers.BitsAndBytesConfig`` for load_in_4bit / load_in_8bit, else None."""
    if not (model_args.load_in_4bit or model_args.load_in_8bit):
        return None
    from transformers import BitsAndBytesConfig

    if model_args.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_compute_dtype=model_args.dtype,
        bnb_4bit_quant_type=model_args.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=model_args.use_bnb_nested_quant,
        bnb_4bit_quant_storage=model_args.bnb_4bit_quant_storage,
    )


def get_kbit_device_map() -> dict[str, Any] | None:
    """Older TRL scripts' device map for k-bit models: the whole model on this process's accelerator, or None on CPU."""
    import torch

    from grpokit.train import distributed

    local = distributed.position()[2]
    if torch.cuda.is_available():
        return {"": local}
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return {"": f"xpu:{local}"}
    return None
