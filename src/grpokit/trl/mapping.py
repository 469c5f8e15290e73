"""TRL 1.16 GRPOConfig -> grpokit Config: the mapping, in one table that the code runs and the docs show.

``MAPPING`` is the one place that says which grpokit field each TRL argument sets; ``to_config``
runs it and ``mapping_table`` renders it for docs/TRL.md (tests/trl/test_trl_mapping.py checks the
committed table equals the generated one, so the documentation cannot drift from the code).

Step semantics. A TRL step is one optimizer update over ``per_device_train_batch_size *
gradient_accumulation_steps * processes`` completions; one generation batch of
``per_device_train_batch_size * steps_per_generation * processes`` completions feeds
``steps_per_generation / gradient_accumulation_steps`` of them, ``num_iterations`` times. A grpokit
step samples ``prompts_per_step * group_size`` completions and makes ``num_iterations *
updates_per_batch`` updates on them. So ``prompts_per_step = generation batch / num_generations``,
``micro_batch_size = per_device_train_batch_size``, ``updates_per_batch = steps_per_generation /
gradient_accumulation_steps`` and ``train.steps = max_steps / (num_iterations * updates_per_batch)``.
When steps_per_generation is not a multiple of gradient_accumulation_steps, an optimizer step spans
generation batches (TRL's rolling window): ``updates_per_batch = steps_per_generation`` slices, of which
``accumulation_slices = gradient_accumulation_steps`` make one update, and ``max_updates = max_steps``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

from grpokit.config.io import set_field
from grpokit.config.sections import Config, ConfigError
from grpokit.config.validation.rollout import GENERATE_OWN_KEYS
from grpokit.train.models import ATTN_IMPLEMENTATIONS

from .config import SUPPORTED, UNSUPPORTED, GRPOConfig
from .loss_args import clip_fields, entropy_fields, loss_fields, objectives_fields
from .optim_args import optimizer_fields, schedule_fields
from .run_args import RUN_MANAGEMENT
from .sampling_args import vllm_fields
from .step_args import batch_fields, epoch_rounds, rounds_per, steps_fields, trl_max_steps, trl_steps_in


def _refuse(name: str, value: Any, valid: str) -> ConfigError:
    return ConfigError(f"GRPOConfig argument {name}={value!r} is not supported by grpokit; valid: {valid}")


@dataclass(frozen=True)
class Rule:
    """One row of the mapping: TRL arguments -> grpokit fields, and how."""

    args: tuple[str, ...]
    fields: tuple[str, ...]
    how: str
    apply: Callable[[GRPOConfig, dict], dict[str, Any]]


def _scale(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    if a.scale_rewards not in ("group", "batch", "none"):
        raise _refuse("scale_rewards", a.scale_rewards, "group (True), batch, none (False)")
    return {"algo.scale": a.scale_rewards}


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
        raise _refuse(
            "model_init_kwargs",
            kw,
            "dtype (or torch_dtype), attn_implementation and trust_remote_code; other loading options only at None",
        )
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise _refuse("model_init_kwargs", {"dtype": dtype}, "dtype auto, float32, bfloat16 or float16")
    if attn not in ATTN_IMPLEMENTATIONS:
        raise _refuse(
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
        "rollout.top_p": a.top_p,
        "rollout.top_k": a.top_k,
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
            raise _refuse(
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
            raise _refuse(
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


def _ref_sync(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    if not a.sync_ref_model:
        return {"algo.ref_refresh_every": 0}
    every = rounds_per(a.ref_model_sync_steps, a, ctx["world_size"])  # TRL counts optimizer steps, grpokit rounds
    return {"algo.ref_refresh_every": every, "algo.ref_mixup_alpha": a.ref_model_mixup_alpha}


def _every(value: float, steps: int) -> int:
    """A step count, or a fraction of the run's steps (transformers' convention for values below 1)."""
    return max(1, math.ceil(value * steps)) if 0 < value < 1 else int(value)


def _saving(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    if a.save_strategy not in ("steps", "epoch", "no"):
        raise _refuse("save_strategy", a.save_strategy, "steps, epoch, no")
    steps_every = rounds_per(
        _every(a.save_steps, trl_steps_in(ctx["steps"], a, ctx)), a, ctx["world_size"]
    )  # save_steps
    every = {"steps": steps_every, "epoch": epoch_rounds(a, ctx), "no": 0}[a.save_strategy]  # counts TRL's steps
    keep = a.save_total_limit if a.save_total_limit else (ctx["steps"] // every + 1 if every else 1)
    if a.hub_strategy not in ("every_save", "end"):  # checkpoint, all_checkpoints: pushed for resuming from the Hub
        raise _refuse(
            "hub_strategy",
            a.hub_strategy,
            "every_save, end (a grpokit checkpoint resumes only inside its run "
            "folder, so one pushed alone could not be resumed from as transformers' last-checkpoint is)",
        )
    # TRL reuses output_dir run after run; grpokit's refusal of an occupied folder would break its scripts
    return {
        "train.save_every": every,
        "train.keep_checkpoints": keep,
        "train.out": a.output_dir or "trainer_output",
        "train.overwrite": True,
        "train.save_last": a.save_strategy != "no",
    }  # transformers: "no" writes no checkpoint


def _logging(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    reports = [a.report_to] if isinstance(a.report_to, str) or a.report_to is None else list(a.report_to)
    reports = [r for r in reports if r not in (None, "none")]
    trackers = ("tensorboard", "wandb", "mlflow", "trackio")
    bad = [r for r in reports if r not in trackers]
    if bad:
        raise _refuse("report_to", a.report_to, "none or a list of " + ", ".join(trackers))
    hosted = {
        n: getattr(a, n) for n in ("trackio_space_id", "trackio_bucket_id", "trackio_static_space_id") if getattr(a, n)
    }
    if hosted and "trackio" in reports:  # without trackio reporting transformers never reads them, nor does grpokit
        name, value = next(iter(hosted.items()))
        raise _refuse(
            name,
            value,
            "None with report_to trackio (grpokit's Trackio sink logs to the local database "
            "only, it hosts no Space or bucket); drop trackio from report_to to keep the value",
        )
    if a.logging_strategy not in ("steps", "epoch", "no"):
        raise _refuse("logging_strategy", a.logging_strategy, "steps, epoch, no")
    every = epoch_rounds(a, ctx) if a.logging_strategy == "epoch" else _every(a.logging_steps, ctx["steps"])
    return {
        "record.sinks": ([] if a.disable_tqdm else ["console"]) + reports,
        "record.console_every": every,
        "record.run_name": a.run_name or "",
        "record.project": a.project if "trackio" in reports else "",
        "record.samples_every": every if a.log_completions else 0,
    }


def _eval(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    if a.eval_strategy not in ("no", "steps", "epoch"):
        raise _refuse("eval_strategy", a.eval_strategy, "no, steps, epoch")
    return {
        "train.eval_every": 0
    }  # GRPOTrainer.evaluate() runs at TRL's eval steps or epoch ends (grpokit/trl/bridge.py)


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
        raise _refuse(name, getattr(a, name), "None or {'use_reentrant': False}")
    on = a.gradient_checkpointing if a.activation_checkpointing is None else a.activation_checkpointing
    return {"model.gradient_checkpointing": bool(on), "model.trust_remote_code": a.trust_remote_code}


# what transformers' TrainingArguments writes into fsdp_config for fsdp="full_shard" (or True): grpokit's FSDP2
_FSDP_DEFAULTS = {
    ("fsdp_version", 2),
    ("version", 2),
    ("reshard_after_forward", True),
    ("min_num_params", 0),
    ("xla", False),
    ("xla_fsdp_v2", False),
    ("xla_fsdp_grad_ckpt", False),
}


def _fsdp(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    opts = (
        a.fsdp.split()
        if isinstance(a.fsdp, str)
        else ([] if a.fsdp in (None, False) else ["full_shard"] if a.fsdp is True else list(a.fsdp))
    )
    if opts and (opts[0] != "full_shard" or set(opts[1:]) - {"auto_wrap"}):
        raise _refuse(
            "fsdp", a.fsdp, "None, True, 'full_shard' or 'full_shard auto_wrap' (grpokit's FSDP2 shards fully)"
        )
    cfg = {k: v for k, v in (a.fsdp_config or {}).items() if (k, v) not in _FSDP_DEFAULTS}
    if cfg:
        raise _refuse("fsdp_config", a.fsdp_config, "None, {} or {'fsdp_version': 2}")
    return {"train.fsdp": bool(opts)}


def _samples(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    n = a.num_completions_to_print
    return {} if n is None else {"record.samples_prompts": math.ceil(n / a.num_generations)}


def _v(**pairs: str) -> Callable[[GRPOConfig, dict], dict[str, Any]]:
    """A plain copy: grpokit field <- TRL argument."""
    return lambda a, ctx: {f: getattr(a, n) for f, n in pairs.items()}


MAPPING: list[Rule] = [
    Rule(
        ("save_only_model",),
        ("train.save_only_model",),
        "copied: checkpoints without optimizer, schedule and RNG state; a resume from one loads the weights with a fresh "
        "optimizer and schedule, as transformers",
        _v(**{"train.save_only_model": "save_only_model"}),
    ),
    Rule(
        ("output_dir", "save_strategy", "save_steps", "save_total_limit", "hub_strategy"),
        ("train.out", "train.save_every", "train.keep_checkpoints", "train.overwrite", "train.save_last"),
        'None output_dir is "trainer_output"; save_strategy=epoch saves at the end of every epoch (steps per epoch as TRL\'s '
        "dataloader counts them, see max_steps) and of training; save_strategy=no writes no checkpoint (save_last false), as transformers; save_total_limit None keeps all; "
        "output_dir is reused as in TRL (train.overwrite=true: a new run replaces the folder's run)",
        _saving,
    ),
    Rule(
        (
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "num_generations",
            "steps_per_generation",
            "generation_batch_size",
        ),
        (
            "train.prompts_per_step",
            "train.micro_batch_size",
            "rollout.group_size",
            "train.updates_per_batch",
            "train.accumulation_slices",
            "train.accumulation_epoch_steps",
        ),
        "prompts_per_step = per_device_train_batch_size * steps_per_generation (None: gradient_accumulation_steps) * "
        "processes / num_generations; updates_per_batch = steps_per_generation / gradient_accumulation_steps "
        "(generation_batch_size: steps_per_generation = it / (per_device_train_batch_size * processes)); not a multiple: "
        "updates_per_batch = steps_per_generation and accumulation_slices = gradient_accumulation_steps, TRL's rolling "
        "window (an optimizer step may span two generation batches; one process only), whose last window of an epoch "
        "is shorter, as transformers' (accumulation_epoch_steps = the generation batches of an epoch; none when streamed)",
        lambda a, ctx: {**batch_fields(a, ctx), "rollout.group_size": a.num_generations},
    ),
    Rule(
        ("max_steps", "num_train_epochs"),
        ("train.steps", "train.max_updates"),
        "steps = max_steps / (num_iterations * updates_per_batch); max_steps -1: ceil(num_train_epochs * steps per epoch), an "
        "epoch being TRL's: the whole generation batches in train_dataset (its last rows short of one are dropped, as "
        "RepeatSampler does), each num_iterations * steps_per_generation / gradient_accumulation_steps steps; rolling "
        "window: steps = TRL's steps * accumulation_slices / (num_iterations * updates_per_batch) rounded up; "
        "max_updates = TRL's steps, so the run ends right after TRL's last step, even inside a generation batch",
        steps_fields,
    ),
    Rule(
        ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm"),
        (
            "optim.lr",
            "optim.weight_decay",
            "optim.adam_beta1",
            "optim.adam_beta2",
            "optim.adam_eps",
            "optim.max_grad_norm",
        ),
        "copied",
        _v(
            **{
                "optim.lr": "learning_rate",
                "optim.weight_decay": "weight_decay",
                "optim.adam_beta1": "adam_beta1",
                "optim.adam_beta2": "adam_beta2",
                "optim.adam_eps": "adam_epsilon",
                "optim.max_grad_norm": "max_grad_norm",
            }
        ),
    ),
    Rule(
        ("lr_scheduler_type", "warmup_steps", "lr_scheduler_kwargs"),
        (
            "optim.schedule",
            "optim.warmup_steps",
            "optim.schedule_steps",
            "optim.num_cycles",
            "optim.restart_cycles",
            "optim.min_lr_rate",
            "optim.warmup_lr_rate",
            "optim.power",
            "optim.lr_end",
            "optim.timescale",
            "optim.num_decay_steps",
            "optim.num_stable_steps",
            "optim.warmup_type",
            "optim.decay_type",
        ),
        "transformers' schedule of that name over max_steps updates (schedule_steps); constant_with_warmup is grpokit's "
        "constant, transformers' constant has no warm-up; a fractional warmup_steps is a share of max_steps; "
        "lr_scheduler_kwargs keys set the fields of the same name, except cosine_with_restarts' num_cycles: restart_cycles, "
        "min_lr: min_lr_rate = min_lr / learning_rate, min_lr_ratio: min_lr_rate (constant and constant_with_warmup "
        "ignore them, as transformers); reduce_lr_on_plateau and greedy are refused (they follow an evaluation metric)",
        lambda a, ctx: schedule_fields(a, trl_max_steps(a, ctx)),
    ),
    Rule(
        ("optim", "optim_args"),
        (
            "optim.optimizer",
            "optim.momentum",
            "optim.dampening",
            "optim.nesterov",
            "optim.lr_decay",
            "optim.rms_alpha",
            "optim.eps",
            "optim.centered",
        ),
        "adamw_torch(_fused): adamw; adafactor, sgd, adagrad, rmsprop: the same, as transformers' Trainer builds them "
        "(Adafactor on the learning rate and schedule, no relative step or parameter scaling); adamw_8bit (adamw_bnb_8bit), "
        "paged_adamw_8bit (bitsandbytes), adamw_torch_4bit and adamw_torch_8bit (torchao) when that package is installed; "
        "optim_args read as transformers: sgd momentum, dampening, nesterov; adagrad lr_decay, eps; rmsprop momentum, "
        "alpha (rms_alpha), eps, centered; their weight_decay key changes nothing, as in transformers (the parameter "
        "groups' weight_decay wins); the other optimizers read no optim_args, as transformers",
        lambda a, ctx: optimizer_fields(a),
    ),
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
        "copied",
        _v(**{"train.seed": "seed", "train.deterministic": "full_determinism", "data.shuffle": "shuffle_dataset"}),
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
        "any other key (num_beams 2, length_penalty, do_sample False ...) picks rollout.engine=generate, which passes them "
        "to transformers' generate() as TRL does (no sampling logprobs then; not with use_vllm); cache_implementation "
        "static or dynamic picks grpokit's decode loop of that cache, another (offloaded ...) engine=generate with it, as "
        "TRL's generation config (ignored with use_vllm, as TRL); with tools the whole episode (tool results included) is capped at max_completion_length, as TRL",
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
    Rule(
        ("beta", "use_bias_correction_kl"),
        ("algo.beta", "algo.kl_bias_correction"),
        "copied; KL estimator k3 as TRL",
        lambda a, ctx: {
            "algo.beta": a.beta,
            "algo.kl_bias_correction": a.use_bias_correction_kl,
            "algo.kl_estimator": "k3",
        },
    ),
    Rule(("num_iterations",), ("algo.num_iterations",), "copied", _v(**{"algo.num_iterations": "num_iterations"})),
    Rule(
        ("epsilon", "epsilon_high", "delta"),
        ("algo.clip_low", "algo.clip_high", "algo.dual_clip"),
        "epsilon_high None: epsilon; delta (two-sided clipping, capping the ratio where A < 0) is dual_clip, "
        "only above 1 + epsilon_high (below it TRL's cap also clips A > 0)",
        clip_fields,
    ),
    Rule(
        ("importance_sampling_level",),
        ("algo.ratio_level",),
        "token or sequence (GSPO)",
        lambda a, ctx: {"algo.ratio_level": a.importance_sampling_level},
    ),
    Rule(
        ("scale_rewards",),
        ("algo.scale",),
        "group, batch, none (True: group, False: none); baseline group mean, unbiased std, eps 1e-4",
        lambda a, ctx: {**_scale(a, ctx), "algo.baseline": "group_mean", "algo.std": "unbiased", "algo.adv_eps": 1e-4},
    ),
    Rule(
        (
            "loss_type",
            "sapo_temperature_pos",
            "sapo_temperature_neg",
            "vespo_k_pos",
            "vespo_lambda_pos",
            "vespo_k_neg",
            "vespo_lambda_neg",
        ),
        (
            "algo.aggregation",
            "algo.objective",
            "algo.sapo_tau_pos",
            "algo.sapo_tau_neg",
            "algo.ratio_level",
            "algo.vespo_pos",
            "algo.vespo_neg",
        ),
        "grpo and sapo: seq-mean-token-mean, dapo, bnpo, cispo and vespo: token-mean, dr_grpo: seq-mean-token-sum-norm, "
        "luspo: seq-mean-token-sum (the clipped surrogate summed over each completion); "
        "cispo: objective cispo, clip_high = epsilon_high - 1 (TRL's epsilon_high is the weight's cap); "
        "sapo: objective sapo with the two temperatures; vespo: objective vespo at ratio_level trajectory "
        "(not with beta > 0 and use_bias_correction_kl; vLLM importance sampling in the token modes joins the weight, as TRL)",
        loss_fields,
    ),
    Rule(
        ("multi_objective_aggregation",),
        ("reward.normalize_components", "algo.scale"),
        "normalize_then_sum: normalize_components and scale batch_whiten (scale_rewards is then unused, as in TRL)",
        objectives_fields,
    ),
    Rule(
        ("reward_weights",),
        ("reward.weights",),
        "one weight per reward function, callables included",
        lambda a, ctx: {"reward.weights": list(a.reward_weights or [])},
    ),
    Rule(
        ("mask_truncated_completions",),
        ("algo.mask_truncated",),
        "copied",
        _v(**{"algo.mask_truncated": "mask_truncated_completions"}),
    ),
    Rule(
        ("sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps"),
        ("algo.ref_refresh_every", "algo.ref_mixup_alpha"),
        "every ref_model_sync_steps TRL steps (in grpokit steps: divided by the updates per round, at least 1), ref <- alpha * policy + (1 - alpha) * ref (alpha 1: a copy)",
        _ref_sync,
    ),
    Rule(
        ("top_entropy_quantile",),
        ("algo.entropy_top_fraction",),
        "copied",
        _v(**{"algo.entropy_top_fraction": "top_entropy_quantile"}),
    ),
    Rule(
        (
            "entropy_coef",
            "use_adaptive_entropy",
            "entropy_coef_min",
            "entropy_coef_max",
            "entropy_coef_delta",
            "entropy_target",
        ),
        (
            "algo.entropy_coef",
            "algo.entropy_aggregation",
            "algo.entropy_adaptive",
            "algo.entropy_coef_min",
            "algo.entropy_coef_max",
            "algo.entropy_coef_delta",
            "algo.entropy_target",
        ),
        "entropy_aggregation token-mean, as TRL; use_adaptive_entropy is entropy_adaptive (TRL's code: the coefficient "
        "rises when the entropy is at or below the target, and the first step applies none)",
        entropy_fields,
    ),
    Rule(
        ("cast_lm_head_to_fp32", "neftune_noise_alpha", "router_aux_loss_coef"),
        ("model.lm_head_fp32", "model.neftune_noise_alpha", "model.router_aux_loss_coef"),
        "copied; neftune_noise_alpha None: 0 (off), noise during the whole training step as TRL (generation included); "
        "router_aux_loss_coef None: -1 (the MoE model config's own, 0 for other models)",
        lambda a, ctx: {
            "model.lm_head_fp32": a.cast_lm_head_to_fp32,
            "model.neftune_noise_alpha": a.neftune_noise_alpha or 0.0,
            "model.router_aux_loss_coef": -1.0 if a.router_aux_loss_coef is None else a.router_aux_loss_coef,
        },
    ),
    Rule(
        ("torch_compile", "torch_compile_backend", "torch_compile_mode"),
        ("model.compile", "model.compile_backend", "model.compile_mode"),
        "the backbone of the log-probability passes (old log-probs, update) through torch.compile, sampling eager; "
        "backend None: inductor, mode None: default; a backend or mode set turns it on, as transformers",
        lambda a, ctx: {
            "model.compile": bool(a.torch_compile or a.torch_compile_backend or a.torch_compile_mode),
            "model.compile_backend": a.torch_compile_backend or "inductor",
            "model.compile_mode": a.torch_compile_mode or "default",
        },
    ),
    Rule(
        ("off_policy_mask_threshold",),
        ("algo.offpolicy_delta",),
        "None: 0 (off)",
        lambda a, ctx: {"algo.offpolicy_delta": a.off_policy_mask_threshold or 0.0},
    ),
    Rule(
        ("max_tool_calling_iterations",),
        ("env.max_turns",),
        "model turns = iterations + 1; None keeps env.max_turns",
        lambda a, ctx: (
            {} if a.max_tool_calling_iterations is None else {"env.max_turns": a.max_tool_calling_iterations + 1}
        ),
    ),
    Rule(
        (
            "report_to",
            "logging_steps",
            "log_completions",
            "disable_tqdm",
            "run_name",
            "logging_strategy",
            "project",
            "trackio_space_id",
            "trackio_bucket_id",
            "trackio_static_space_id",
        ),
        ("record.sinks", "record.console_every", "record.samples_every", "record.run_name", "record.project"),
        "report_to trackers join the console; log_completions writes samples.jsonl every logging_steps; project is "
        "the Trackio project with report_to trackio (as transformers; other trackers keep grpokit's); trackio_space_id, "
        "trackio_bucket_id and trackio_static_space_id are accepted when nothing reports to trackio (transformers reads "
        "them in its Trackio callback only), refused with it (grpokit's Trackio sink hosts no Space); logging_strategy=epoch "
        "logs at the end of every epoch and of training (logging_first_step still logs step 1, as transformers)",
        _logging,
    ),
    Rule(
        ("num_completions_to_print",),
        ("record.samples_prompts",),
        "whole groups: ceil(num_completions_to_print / num_generations) prompts per sample dump (None: grpokit's 2)",
        _samples,
    ),
    Rule(
        ("ddp_timeout",),
        ("train.dist_timeout_s",),
        "copied: the process group's timeout under torchrun, as transformers",
        _v(**{"train.dist_timeout_s": "ddp_timeout"}),
    ),
    Rule(
        ("fsdp", "fsdp_config"),
        ("train.fsdp",),
        "full_shard (auto_wrap or not) or True: FSDP2 (grpokit wraps each decoder layer); fsdp_config only fsdp_version 2",
        _fsdp,
    ),
    Rule(
        ("eval_strategy", "eval_steps"),
        ("train.eval_every",),
        "GRPOTrainer.evaluate() every eval_steps TRL steps (None: logging_steps), or with eval_strategy=epoch at the end of "
        "every epoch and of training (eval_delay counts epochs then, as transformers); grpokit's own greedy evaluation is off",
        _eval,
    ),
]
HANDLED_ELSEWHERE = {  # arguments the trainer itself carries out (grpokit/trl/trainer.py)
    "push_to_hub": "GRPOTrainer pushes the final model (and, with hub_strategy every_save, each checkpoint)",
    "hub_model_id": "repository of push_to_hub (None: output_dir's name)",
    "hub_token": "token of push_to_hub",
    "hub_private_repo": "private flag of push_to_hub",
    "remove_unused_columns": "True drops every dataset column but prompt",
    "disable_dropout": "sets the policy's dropout probabilities to 0",
    "per_device_eval_batch_size": "completions per batch of evaluate()",
    "num_generations_eval": "completions per eval prompt in evaluate() (None: num_generations)",
    "eval_on_start": "evaluate() before the first step",
    "logging_first_step": "log_history also gets step 1",
    "resume_from_checkpoint": "train() resumes from it when called without one",
    "tf32": "sets torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32 (None: unchanged)",
    "dataloader_num_workers": "no effect: grpokit holds the prompts in memory, there is no DataLoader",
    "dataloader_pin_memory": "no effect (no DataLoader)",
    "dataloader_persistent_workers": "no effect (no DataLoader)",
    "dataloader_prefetch_factor": "no effect (no DataLoader)",
    "accelerator_config": "no effect: it configures accelerate's DataLoader dispatch; grpokit uses neither",
    "use_liger_kernel": "no effect on the math: grpokit computes completion log-probs in chunks, never the full "
    "logits tensor, which is what Liger's fused loss saves (equal losses, tests/project/test_bench_loss_equality.py)",
    "pad_to_multiple_of": "no effect: padding changes no log-prob, loss or gradient; grpokit pads or packs as it chooses",
    "log_unique_prompts": "no effect: samples.jsonl already holds each prompt once with its group",
}
HANDLED_ELSEWHERE.update(RUN_MANAGEMENT)
HANDLED_ELSEWHERE.update(
    {  # accepted with no effect, as in TRL's GRPO (its trainer overrides what reads them)
        "use_transformers_continuous_batching": "sampling with continuous batching: grpokit's own decode loop, which drops "
        "finished rows from the batch (same distribution); refused for a vision model, as TRL",
        "transformers_continuous_batching_config": "checked as transformers' ContinuousBatchingConfig keywords; sizes a paged "
        "cache grpokit's decode loop does not have",
        "use_transformers_paged": "deprecated alias: True sets use_transformers_continuous_batching, with TRL's FutureWarning",
        "label_smoothing_factor": "no effect, as TRL: transformers applies it in Trainer.compute_loss, which GRPOTrainer replaces",
        "liger_kernel_config": "no effect, as use_liger_kernel",
        "prediction_loss_only": "no effect, as TRL: GRPO's prediction_step returns the loss only",
        "eval_do_concat_batches": "no effect, as TRL (no predictions)",
        "eval_use_gather_object": "no effect, as TRL (no predictions)",
        "eval_accumulation_steps": "no effect, as TRL (no predictions)",
        "include_for_metrics": "no effect, as TRL (GRPOTrainer takes no compute_metrics)",
        "batch_eval_metrics": "no effect, as TRL (GRPOTrainer takes no compute_metrics)",
        "dataloader_drop_last": "no effect, as TRL: its RepeatSampler yields whole generation batches only",
        "dataloader_multiprocessing_context": "no effect (no DataLoader workers)",
        "label_names": "no effect, as TRL (GRPO inputs carry no labels)",
        "train_sampling_strategy": "no effect, as TRL: RepeatSampler replaces transformers' sampler (shuffle_dataset decides)",
        "length_column_name": "no effect, as TRL (group_by_length's column; RepeatSampler does not read it)",
        "ds3_gather_for_generation": "no effect: DeepSpeed ZeRO-3 only (deepspeed is refused)",
        "log_multimodal": "no effect: samples.jsonl keeps text, never images",
        "local_rank": "no effect: the rank comes from LOCAL_RANK, as transformers when it is set",
        "log_on_each_node": "grpokit logs on global rank 0 only (log_on_each_node=False); one node: the same",
        "dataloader_in_order": "no effect (no DataLoader workers)",
        "ddp_find_unused_parameters": "no effect: grpokit all-reduces gradients itself, no DistributedDataParallel wrapper",
        "ddp_bucket_cap_mb": "no effect (no DistributedDataParallel wrapper)",
        "ddp_broadcast_buffers": "no effect (no DistributedDataParallel wrapper)",
        "ddp_static_graph": "no effect (no DistributedDataParallel wrapper)",
    }
)
FIXED = {
    "data.task": "",
    "data.dataset": "",
    "data.eval_dataset": "",
    "reward.functions": [],
    "reward.convention": "trl",
    "reward.num_workers": 0,
}  # grpokit fields the TRL layer always sets (FIXED_DOC says why)


def to_config(args: GRPOConfig, *, num_rows: int, world_size: int | None = None, streamed: bool = False) -> Config:
    """The grpokit ``Config`` of a TRL ``GRPOConfig`` (``num_rows``: training prompts, for epochs;
    ``streamed``: an IterableDataset, which has no epochs)."""
    ctx = {
        "num_rows": num_rows,
        "world_size": world_size or int(os.environ.get("WORLD_SIZE", "1")),
        "streamed": streamed,
    }
    cfg = Config()
    for name, value in FIXED.items():
        set_field(cfg, name, value)
    ctx["steps"] = steps_fields(args, ctx)["train.steps"]
    for rule in MAPPING:
        for name, value in rule.apply(args, ctx).items():
            set_field(cfg, name, value)
    return cfg


def mapping_table() -> str:
    """docs/TRL.md's tables, rendered from MAPPING, HANDLED_ELSEWHERE, FIXED and UNSUPPORTED."""
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(GRPOConfig)
        if f.name in SUPPORTED
    }
    lines = ["| TRL argument (default) | grpokit field | how |", "| --- | --- | --- |"]
    for rule in MAPPING:
        args = "<br>".join(f"`{n}` ({defaults[n]!r})" for n in rule.args)
        lines.append(f"| {args} | {'<br>'.join(f'`{f}`' for f in rule.fields)} | {rule.how} |")
    for name, how in HANDLED_ELSEWHERE.items():
        lines.append(f"| `{name}` ({defaults[name]!r}) | (GRPOTrainer) | {how} |")
    covered = {n for r in MAPPING for n in r.args} | set(HANDLED_ELSEWHERE)
    missing = [n for n in defaults if n not in covered]
    if missing:  # every declared argument must be mapped somewhere
        raise AssertionError(f"GRPOConfig arguments without a mapping rule: {missing}")
    fixed = ", ".join(f"`{k}={v!r}`" for k, v in FIXED.items())
    lines += [
        "",
        f"Always set by the TRL layer: {fixed}. {' '.join(FIXED_DOC.split())}",
        "",
        "Accepted only at TRL's default (any other value is refused with one sentence naming the argument):",
        "",
        ", ".join(f"`{k}`" for k in UNSUPPORTED) + ".",
        "",
    ]
    return "\n".join(lines)


FIXED_DOC = """The data and reward functions come from GRPOTrainer's arguments; reward functions receive TRL's
convention and run in the trainer's process."""
