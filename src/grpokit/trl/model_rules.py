"""The mapping's rules for the model and sampling: precision, checkpointing, model_init_kwargs, the
device, seeds, generation settings (temperature, top-p, generation_kwargs ...), chat templates and vLLM.

Rows of ``MAPPING`` (grpokit/trl/mapping.py), in the order docs/TRL.md shows them.
"""

from __future__ import annotations

from typing import Any

from grpokit.config.sections import ConfigError
from grpokit.nn.models import ATTN_IMPLEMENTATIONS
from grpokit.validation.rollout import GENERATE_OWN_KEYS

from .config import GRPOConfig
from .rule import Rule, refuse
from .sampling_args import vllm_fields


def _precision(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    if a.fp16 and a.bf16:
        raise ConfigError("GRPOConfig sets both bf16=True and fp16=True; choose one")
    return {"model.autocast": "float16" if a.fp16 else {None: "auto", True: "bfloat16", False: "off"}[a.bf16]}


def _model_init(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
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


def _generation(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    out = {
        "rollout.temperature": a.temperature,
        "rollout.top_p": min(a.top_p, 1.0),  # above 1: off, as transformers (no nucleus filter)
        "rollout.top_k": max(a.top_k, 0),  # -1: off, as vLLM (TRL passes it to vLLM)
        "rollout.min_p": a.min_p or 0.0,
        "rollout.max_new_tokens": a.max_completion_length,
        "rollout.repetition_penalty": a.repetition_penalty,
    }
    extra = {}  # what only transformers' generate() does: beam search, no_repeat_ngram_size ...
    for key, value in (a.generation_kwargs or {}).items():
        if (key, value) in (("do_sample", True), ("num_beams", 1)):
            continue  # what grpokit's own loops do anyway
        if key in _GENERATION_FIELDS:
            field = _GENERATION_FIELDS[key]
            out[f"rollout.{field}"] = [value] if field == "stop" and isinstance(value, str) else value
        elif key in GENERATE_OWN_KEYS:  # TRL sets these itself from the tokenizer and its one-completion-per-row layout
            raise refuse(
                "generation_kwargs",
                {key: value},
                "keys other than "
                + ", ".join(GENERATE_OWN_KEYS[7:])
                + " (TRL and grpokit set them from the tokenizer and one completion per row)",
            )
        else:
            extra[key] = value
    cache = extra.pop("cache_implementation", a.cache_implementation)  # TRL: generation_kwargs override its own
    if cache in ("static", "dynamic") and not extra and not a.use_vllm:
        out["rollout.engine"] = cache  # grpokit's own decode loops with that cache
    elif cache is not None and not a.use_vllm:  # vLLM keeps its own paged cache, as in TRL
        extra["cache_implementation"] = cache
    if set(extra) - {"length_penalty"}:  # length_penalty alone weighs beam scores only: no beams, no effect
        if a.use_vllm:
            raise refuse(
                "generation_kwargs",
                extra,
                "with use_vllm only temperature, top_p, top_k, min_p, max_tokens, "
                "stop and repetition_penalty (grpokit passes no other keys to vLLM)",
            )
        out.update(
            {"rollout.engine": "generate", "rollout.generation_kwargs": extra}
        )  # TRL hands them to model.generate
    out["env.max_episode_tokens"] = (
        a.max_completion_length
    )  # TRL: a tool episode's whole completion, tool results included
    return out


_GENERATION_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "max_new_tokens": "max_new_tokens",
    "max_tokens": "max_new_tokens",
    "stop_strings": "stop",
    "stop": "stop",
    "repetition_penalty": "repetition_penalty",
}


def _checkpointing(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    # transformers 5: gradient_checkpointing* are aliases of activation_checkpointing*, used when the new name is None
    # (its __post_init__ then copies one onto the other: the refusal names the one the user wrote)
    if a.activation_checkpointing_kwargs != a.gradient_checkpointing_kwargs:  # one set after construction
        name = (
            "activation_checkpointing_kwargs"
            if a.activation_checkpointing_kwargs is not None
            else "gradient_checkpointing_kwargs"
        )
    else:
        name = a.__dict__.get("_checkpointing_kwargs_name", "gradient_checkpointing_kwargs")
    kwargs = dict(getattr(a, name) or {})
    if kwargs.pop("use_reentrant", False) or kwargs:
        raise refuse(name, getattr(a, name), "None or {'use_reentrant': False}")
    on = a.gradient_checkpointing if a.activation_checkpointing is None else a.activation_checkpointing
    return {"model.gradient_checkpointing": bool(on), "model.trust_remote_code": a.trust_remote_code}


MODEL_RULES: list[Rule] = [
    Rule(
        ("bf16", "fp16"), ("model.autocast",), "bf16 None: auto; True: bfloat16; False: off; fp16: float16", _precision
    ),
    Rule(
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
    ),
    Rule(
        ("model_init_kwargs",),
        ("model.dtype", "model.trust_remote_code", "model.attn_implementation"),
        "dtype / torch_dtype (None: float32, as TRL), attn_implementation (None: transformers' choice) and "
        "trust_remote_code; other keys only at None",
        _model_init,
    ),
    Rule(
        ("use_cpu",),
        ("model.device",),
        "True: cpu, False: auto",
        lambda a, ctx: {"model.device": "cpu" if a.use_cpu else "auto"},
    ),
    Rule(
        ("seed", "full_determinism", "shuffle_dataset"),
        ("train.seed", "train.deterministic", "data.shuffle"),
        "copied; shuffle_dataset None: no shuffle, as TRL",
        lambda a, ctx: {
            "train.seed": a.seed,
            "train.deterministic": a.full_determinism,
            "data.shuffle": bool(a.shuffle_dataset),  # None: no shuffle, as TRL's sampler (it tests the value)
        },
    ),
    Rule(
        (
            "max_completion_length",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "repetition_penalty",
            "generation_kwargs",
            "cache_implementation",
        ),
        (
            "rollout.max_new_tokens",
            "rollout.temperature",
            "rollout.top_p",
            "rollout.top_k",
            "rollout.min_p",
            "rollout.stop",
            "rollout.repetition_penalty",
            "rollout.engine",
            "rollout.generation_kwargs",
            "env.max_episode_tokens",
        ),
        "min_p None is 0; generation_kwargs keys temperature, top_p, top_k, min_p, max_new_tokens, stop_strings, "
        "repetition_penalty override (the penalty shapes sampling only, not the trained logprobs, as TRL); "
        "any other key (num_beams 2, length_penalty, do_sample False ...) picks rollout.engine=generate, "
        "which passes them "
        "to transformers' generate() as TRL does (no sampling logprobs then; not with use_vllm); cache_implementation "
        "static or dynamic picks grpokit's decode loop of that cache, another (offloaded ...) "
        "engine=generate with it, as "
        "TRL's generation config (ignored with use_vllm, as TRL); with tools the whole episode (tool "
        "results included) is capped at max_completion_length, as TRL",
        _generation,
    ),
    Rule(
        ("chat_template_kwargs",),
        ("data.chat_template_kwargs",),
        "copied; prompts that are chat messages get the template, text prompts are used as written",
        lambda a, ctx: {
            "data.chat_template_kwargs": dict(a.chat_template_kwargs or {}),
            "data.chat_template": "conversational",
        },
    ),
    Rule(
        (
            "use_vllm",
            "vllm_mode",
            "vllm_server_base_url",
            "vllm_server_host",
            "vllm_server_port",
            "vllm_server_timeout",
            "vllm_gpu_memory_utilization",
            "vllm_enable_sleep_mode",
            "vllm_importance_sampling_correction",
            "vllm_importance_sampling_mode",
            "vllm_importance_sampling_clip_max",
            "vllm_importance_sampling_clip_min",
            "vllm_importance_sampling_cap",
            "vllm_max_model_length",
            "vllm_tensor_parallel_size",
        ),
        (
            "rollout.backend",
            "rollout.vllm_url",
            "rollout.vllm_startup_timeout",
            "rollout.vllm_gpu_memory_utilization",
            "rollout.vllm_sleep",
            "rollout.tis_cap",
            "rollout.tis_mode",
            "rollout.tis_min",
            "rollout.vllm_max_model_len",
            "rollout.vllm_tensor_parallel_size",
        ),
        "colocate: vllm, server: vllm_server; importance sampling in all four TRL modes (tis_mode = the mode, "
        "tis_cap = clip_max, or the deprecated vllm_importance_sampling_cap when set, as TRL, None: inf; "
        "tis_min = clip_min, None: 0); vllm_max_model_length is the colocated engine's "
        "max_model_len (None: 0, the model's); vllm_tensor_parallel_size with colocate: one engine per group of that "
        "many consecutive processes, which must divide their number (as TRL); in server mode the server's own flag "
        "decides (as TRL; rollout.vllm_tensor_parallel_size 1)",
        vllm_fields,
    ),
]
