"""TRL's generation and vLLM arguments -> grpokit's rollout fields: max_completion_length, temperature,
top_p / top_k / min_p, repetition_penalty, generation_kwargs and cache_implementation, the chat template,
tool-calling turns, and vLLM (rollout.backend, rollout.vllm_*) with its importance sampling (grpokit's TIS
stage: rollout.tis_mode, tis_cap, tis_min).

Each argument's mapping rule, its arithmetic and its single-value check live here together. The
importance sampling weights, metrics, loss and gradient are checked against TRL's own code in
tests/trl/test_trl_importance_sampling.py.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from grpokit.algo.tis import TIS_MODES
from grpokit.config.sections import ConfigError
from grpokit.validation.rollout import GENERATE_OWN_KEYS, unknown_generation_key

from .predicates import Gate, above, at_least, is_number, within
from .rule import Rule, TrlArgs, refuse


def _generation(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    out = {
        "rollout.temperature": a.temperature,
        "rollout.top_p": min(a.top_p, 1.0),  # above 1: off, as transformers (no nucleus filter)
        "rollout.top_k": max(a.top_k, 0),  # -1: off, as vLLM (TRL passes it to vLLM)
        "rollout.min_p": a.min_p or 0.0,
        "rollout.max_new_tokens": a.max_completion_length,
        "rollout.repetition_penalty": a.repetition_penalty,
        "algo.loss_temperature": 0.0,  # the sampler's, unless generation_kwargs sets sampling apart (below)
    }
    extra = {}  # what only transformers' generate() does: beam search, no_repeat_ngram_size ...
    for key, value in (a.generation_kwargs or {}).items():
        if (key, value) in (("do_sample", True), ("num_beams", 1)):
            continue  # what grpokit's own loops do anyway
        if key in _GENERATION_FIELDS:
            field = _GENERATION_FIELDS[key]
            out[f"rollout.{field}"] = [value] if field == "stop" and isinstance(value, str) else value
            if field == "temperature":  # TRL samples at it, while every log-prob keeps args.temperature
                out["algo.loss_temperature"] = a.temperature
        elif key in GENERATE_OWN_KEYS:  # TRL sets these itself from the tokenizer and its one-completion-per-row layout
            raise refuse(
                "generation_kwargs",
                {key: value},
                "keys other than "
                + ", ".join(GENERATE_OWN_KEYS[7:])
                + " (TRL and grpokit set them from the tokenizer and one completion per row)",
            )
        elif (
            not a.use_vllm and (problem := unknown_generation_key(key)) is not None
        ):  # vLLM's keys: refused below  # TRL's GenerationConfig would keep it unread
            raise ConfigError(f"GRPOConfig argument generation_kwargs {problem}")
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
    if ctx.get("episodes", True):  # TRL: a tool episode's whole completion, tool results included
        out["env.max_episode_tokens"] = a.max_completion_length
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


def vllm_fields(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    """use_vllm and the vllm_* arguments; ``ctx["world_size"]``: the number of trainer processes."""
    if not a.use_vllm:
        return {"rollout.backend": "hf"}
    if a.vllm_mode not in ("colocate", "server"):
        raise refuse("vllm_mode", a.vllm_mode, "colocate, server")
    tp = (
        a.vllm_tensor_parallel_size if a.vllm_mode == "colocate" else 1
    )  # server mode: the server's own flag decides (as TRL)
    world = ctx["world_size"]
    if world % tp:  # as TRL: every group of tp consecutive processes shares one engine
        valid = ", ".join(str(d) for d in range(1, world + 1) if world % d == 0)
        raise ConfigError(
            f"GRPOConfig argument vllm_tensor_parallel_size={tp} must divide the {world} training processes "
            f"with vllm_mode='colocate' (each group of {tp} shares one vLLM engine); valid: {valid}"
        )
    url = a.vllm_server_base_url or f"http://{a.vllm_server_host}:{a.vllm_server_port}"
    return {
        "rollout.backend": "vllm" if a.vllm_mode == "colocate" else "vllm_server",
        "rollout.vllm_url": url,
        "rollout.vllm_startup_timeout": a.vllm_server_timeout,
        **importance_sampling_fields(a),
        "rollout.vllm_gpu_memory_utilization": a.vllm_gpu_memory_utilization,
        "rollout.vllm_sleep": a.vllm_enable_sleep_mode,
        # TRL hands it to the colocated engine only (checks.GATES); a server sets its own
        "rollout.vllm_max_model_len": (a.vllm_max_model_length or 0) if a.vllm_mode == "colocate" else 0,
        "rollout.vllm_tensor_parallel_size": tp,
    }


def importance_sampling_fields(a: TrlArgs) -> dict[str, Any]:
    """TRL's vLLM importance sampling as grpokit's TIS stage: the mode by name, clip_max (or the deprecated
    cap, which replaces it when set) as tis_cap and clip_min as tis_min; None is no bound (inf, 0)."""
    if not a.vllm_importance_sampling_correction:
        return {"rollout.tis_cap": 0.0}
    if a.vllm_importance_sampling_mode not in TIS_MODES:
        raise refuse("vllm_importance_sampling_mode", a.vllm_importance_sampling_mode, ", ".join(TIS_MODES))
    name = (
        "vllm_importance_sampling_cap"
        if a.vllm_importance_sampling_cap is not None
        else "vllm_importance_sampling_clip_max"
    )
    cap = math.inf if getattr(a, name) is None else getattr(a, name)
    if not cap >= 1:  # a weight bound below 1 shrinks every on-policy token's gradient
        raise refuse(name, cap, "None or a number >= 1")
    floor = a.vllm_importance_sampling_clip_min
    if floor is not None and not (floor <= cap and math.isfinite(floor)):
        raise refuse("vllm_importance_sampling_clip_min", floor, f"None or a finite number up to the upper bound {cap}")
    # ratios are > 0, so a bound at or below 0 bounds nothing, as TRL's None
    return {
        "rollout.tis_cap": cap,
        "rollout.tis_mode": a.vllm_importance_sampling_mode,
        "rollout.tis_min": max(floor or 0.0, 0.0),
    }


GENERATION = Rule(
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
        "algo.loss_temperature",
    ),
    "min_p None is 0; generation_kwargs keys temperature, top_p, top_k, min_p, max_new_tokens, stop_strings, "
    "repetition_penalty override sampling only, as TRL: the trained logprobs, KL and entropy keep temperature "
    "(a generation_kwargs temperature sets rollout.temperature, the sampler's, and algo.loss_temperature = "
    "temperature), the penalty is not applied to them and dr_grpo's divisor stays max_completion_length; "
    "any other key (num_beams 2, length_penalty, do_sample False ...) picks rollout.engine=generate, "
    "which passes them "
    "to transformers' generate() as TRL does (no sampling logprobs then; not with use_vllm); cache_implementation "
    "static or dynamic picks grpokit's decode loop of that cache, another (offloaded ...) "
    "engine=generate with it, as "
    "TRL's generation config (ignored with use_vllm, as TRL); a key that is no setting of transformers' "
    "GenerationConfig (a typo: TRL's GenerationConfig keeps it unread) is refused, naming the closest; with tools "
    "(or an environment_factory) the whole episode (tool "
    "results included) is capped at max_completion_length, as TRL",
    _generation,
)

CHAT_TEMPLATE = Rule(
    ("chat_template_kwargs",),
    ("data.chat_template_kwargs",),
    "copied; prompts that are chat messages get the template, text prompts are used as written",
    lambda a, ctx: {
        "data.chat_template_kwargs": dict(a.chat_template_kwargs or {}),
        "data.chat_template": "conversational",
    },
)

TOOL_TURNS = Rule(
    ("max_tool_calling_iterations",),
    ("env.max_turns",),
    "model turns = iterations + 1 (a negative count as 0); None (TRL: no limit) is env.max_turns=0, no turn "
    "limit, the episode bounded by max_completion_length as TRL's is; set only for a trainer with tools or an "
    "environment_factory (TRL reads it only there)",
    lambda a, ctx: (
        # a negative count runs no tool round in TRL (``iteration_num < max``), as 0 does: one model turn; read
        # only in tool episodes (tools or an environment_factory), as TRL's
        {"env.max_turns": 0 if a.max_tool_calling_iterations is None else max(0, a.max_tool_calling_iterations) + 1}
        if ctx.get("episodes", True)
        else {}
    ),
)

VLLM = Rule(
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
)


_VLLM_COLOCATE = Gate(("use_vllm", "vllm_mode"), lambda a: a.use_vllm and a.vllm_mode == "colocate")
_VLLM_SERVER = Gate(("use_vllm", "vllm_mode"), lambda a: a.use_vllm and a.vllm_mode == "server")
_VLLM_IS = Gate(
    ("use_vllm", "vllm_importance_sampling_correction"),
    lambda a: a.use_vllm and a.vllm_importance_sampling_correction,
)

CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {  # single-value checks (checks.py runs them)
    "max_completion_length": (
        at_least(1, integer=True),
        "an integer >= 1 (TRL runs None too: transformers then stops sampling at the model's generation_config "
        "max_length, 20 tokens counting the prompt unless the model sets it, and loss_type dr_grpo fails)",
    ),
    "temperature": (above(0), "a finite number > 0"),
    "top_p": (
        lambda x: is_number(x) and 0 < x,
        "a number > 0 (above 1: off, as 1 and transformers; TRL runs 0 too: it keeps only the most likely token, "
        "so every completion of a group is the same and every advantage 0)",
    ),
    "top_k": (at_least(-1, integer=True), "an integer >= -1 (0 or -1: off, -1 as vLLM)"),
    "min_p": (within(0, 1, none=True), "None or a number in [0, 1]"),
    "repetition_penalty": (above(0), "a finite number > 0"),
    "vllm_tensor_parallel_size": (at_least(1, integer=True), "an integer >= 1"),
    "vllm_max_model_length": (at_least(1, integer=True, none=True), "None or an integer >= 1"),
    "vllm_importance_sampling_cap": (above(0, none=True), "None or a finite number > 0"),
    "vllm_group_port": (
        lambda x: x == 51216,
        "TRL's default 51216 (grpokit's vLLM server client sends the weights without TRL's NCCL group)",
    ),
    # named choices, checked when set (TRL reads them only with use_vllm)
    "vllm_mode": (lambda x: x in ("colocate", "server"), "'colocate' or 'server'"),
    "vllm_importance_sampling_mode": (lambda x: x in TIS_MODES, "one of " + ", ".join(TIS_MODES)),
}

GATES: dict[str, Gate] = {  # fields TRL reads only while another argument is on (checks.py)
    "vllm_tensor_parallel_size": _VLLM_COLOCATE,
    "vllm_max_model_length": _VLLM_COLOCATE,
    "vllm_group_port": _VLLM_SERVER,
    "vllm_importance_sampling_cap": _VLLM_IS,
}
