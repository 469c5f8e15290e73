"""TRL's model arguments -> grpokit's model section: bf16 / fp16, model_init_kwargs (dtype, attention,
trust_remote_code), gradient / activation checkpointing, use_cpu, cast_lm_head_to_fp32, neftune_noise_alpha,
router_aux_loss_coef, torch_compile, disable_dropout and use_liger_kernel.

Each argument's mapping rule and its single-value check live here together.
"""

from __future__ import annotations

from typing import Any, Callable

from grpokit.config.sections import ConfigError
from grpokit.nn.models import ATTN_IMPLEMENTATIONS

from .predicates import at_least
from .rule import Rule, TrlArgs, refuse


def fp16_on_cpu(a: TrlArgs) -> bool:
    """fp16=True on a run that trains on the CPU (use_cpu, or no CUDA device), where accelerate turns
    native mixed precision on only for a non-CPU device: TRL trains such a run in float32."""
    import torch

    return bool(a.fp16) and (a.use_cpu or not torch.cuda.is_available())


def _precision(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    if a.fp16 and a.bf16:
        raise ConfigError("GRPOConfig sets both bf16=True and fp16=True; choose one")
    if a.fp16 and not fp16_on_cpu(a):
        # TRL pairs float16 autocast with a dynamic loss scaler (GradScaler); grpokit has none, and float16
        # gradients without it underflow to 0
        raise refuse("fp16", True, "bf16=True on a GPU (grpokit has no float16 loss scaling), or fp16 on the CPU")
    return {"model.autocast": "off" if a.fp16 else {None: "auto", True: "bfloat16", False: "off"}[a.bf16]}


def _model_init(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    kw = dict(a.model_init_kwargs or {})
    dtype, torch_dtype = kw.pop("dtype", None), kw.pop("torch_dtype", None)
    dtype = dtype if dtype is not None else torch_dtype
    dtype = "float32" if dtype is None else str(dtype).replace("torch.", "")  # TRL loads float32 unless told
    trust = bool(kw.pop("trust_remote_code", False))
    attn = kw.pop("attn_implementation", None) or "auto"
    # from_pretrained's own defaults (TRL's grpo.py passes revision/attn_implementation None) change nothing
    kw = {k: v for k, v in kw.items() if v is not None and not (k == "revision" and v == "main")}
    if kw:
        raise refuse(
            "model_init_kwargs",
            kw,
            "dtype (or torch_dtype), attn_implementation and trust_remote_code; other loading options only at None",
        )
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise refuse("model_init_kwargs", {"dtype": dtype}, "dtype auto, float32, bfloat16 or float16")
    if attn not in ATTN_IMPLEMENTATIONS:
        raise refuse(
            "model_init_kwargs",
            {"attn_implementation": attn},
            "attn_implementation " + ", ".join(ATTN_IMPLEMENTATIONS[1:]),
        )
    return {
        "model.dtype": dtype,
        "model.trust_remote_code": a.trust_remote_code or trust,
        "model.attn_implementation": attn,
    }


def _checkpointing(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    # newer transformers: gradient_checkpointing* are aliases of activation_checkpointing*, used when the new name is
    # None (its __post_init__ then copies one onto the other: the refusal names the one the user wrote); an older
    # transformers has the old names only
    new_kwargs = getattr(a, "activation_checkpointing_kwargs", a.gradient_checkpointing_kwargs)
    if new_kwargs != a.gradient_checkpointing_kwargs:  # one set after construction
        name = "activation_checkpointing_kwargs" if new_kwargs is not None else "gradient_checkpointing_kwargs"
    else:
        name = a.__dict__.get("_checkpointing_kwargs_name", "gradient_checkpointing_kwargs")
    kwargs = dict(getattr(a, name) or {})
    if kwargs.pop("use_reentrant", False) or kwargs:
        raise refuse(name, getattr(a, name), "None or {'use_reentrant': False}")
    new_on = getattr(a, "activation_checkpointing", None)
    on = a.gradient_checkpointing if new_on is None else new_on
    return {"model.gradient_checkpointing": bool(on), "model.trust_remote_code": a.trust_remote_code}


PRECISION = Rule(
    ("bf16", "fp16"),
    ("model.autocast",),
    "bf16 None: auto; True: bfloat16; False: off; fp16: off on the CPU (as accelerate), refused on a GPU (no scaler)",
    _precision,
)

ACTIVATION_CHECKPOINTING = Rule(
    (
        "gradient_checkpointing",
        "gradient_checkpointing_kwargs",
        "trust_remote_code",
        "activation_checkpointing",
        "activation_checkpointing_kwargs",
    ),
    ("model.gradient_checkpointing", "model.trust_remote_code"),
    "copied; gradient_checkpointing_kwargs only use_reentrant False (grpokit's checkpointing is non-reentrant); "
    "activation_checkpointing(_kwargs), transformers 5's names, decide when set",
    _checkpointing,
)

MODEL_INIT = Rule(
    ("model_init_kwargs",),
    ("model.dtype", "model.trust_remote_code", "model.attn_implementation"),
    "dtype / torch_dtype (None: float32, as TRL), attn_implementation (None: transformers' choice) and "
    "trust_remote_code; other keys only at None",
    _model_init,
)

DEVICE = Rule(
    ("use_cpu",),
    ("model.device",),
    "True: cpu, False: auto",
    lambda a, ctx: {"model.device": "cpu" if a.use_cpu else "auto"},
)

MODEL_TERMS = Rule(
    ("cast_lm_head_to_fp32", "neftune_noise_alpha", "router_aux_loss_coef"),
    ("model.lm_head_fp32", "model.neftune_noise_alpha", "model.router_aux_loss_coef"),
    "copied; neftune_noise_alpha None: 0 (off), noise during the whole training step as TRL (generation included); "
    "router_aux_loss_coef None: -1 (the MoE model config's own, 0 for other models)",
    lambda a, ctx: {
        "model.lm_head_fp32": a.cast_lm_head_to_fp32,
        "model.neftune_noise_alpha": a.neftune_noise_alpha or 0.0,
        "model.router_aux_loss_coef": -1.0 if a.router_aux_loss_coef is None else a.router_aux_loss_coef,
    },
)

COMPILE = Rule(
    ("torch_compile", "torch_compile_backend", "torch_compile_mode"),
    ("model.compile", "model.compile_backend", "model.compile_mode"),
    "the backbone of the log-probability passes (old log-probs, update) through torch.compile, sampling eager; "
    "backend None: inductor, mode None: default; a backend or mode set turns it on, as transformers",
    lambda a, ctx: {
        "model.compile": bool(a.torch_compile or a.torch_compile_backend or a.torch_compile_mode),
        "model.compile_backend": a.torch_compile_backend or "inductor",
        "model.compile_mode": a.torch_compile_mode or "default",
    },
)

DROPOUT = Rule(
    ("disable_dropout",),
    ("model.disable_dropout",),
    "copied: True sets every dropout probability of the policy to 0 (LoRA's too, whose model.lora_dropout is then 0, "
    "as TRL's switch zeroes it), with transformers' attention_dropout, which TRL's (torch Dropout modules only) "
    "leaves on; False (TRL's default) trains with the model's dropout",
    lambda a, ctx: {"model.disable_dropout": a.disable_dropout},
)

KERNELS = Rule(
    ("use_liger_kernel",),
    ("model.kernels",),
    "True: auto (liger-kernel's RMSNorm, SwiGLU and RoPE kernels where it is installed and the device is "
    "CUDA, the model's own code otherwise; the same math up to the model dtype's rounding). Liger's fused "
    "loss is not needed: grpokit's output layer never holds the full logits (equal losses, "
    "tests/project/test_bench_loss_equality.py)",
    lambda a, ctx: {"model.kernels": "auto" if a.use_liger_kernel else "torch"},
)


CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {  # single-value checks (checks.py runs them)
    "neftune_noise_alpha": (at_least(0, none=True), "None or a finite number >= 0"),
    "router_aux_loss_coef": (at_least(0, none=True), "None (the model's own) or a finite number >= 0"),
}
