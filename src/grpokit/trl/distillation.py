"""TRL 1.16's ``DistillationConfig`` / ``DistillationTrainer`` on grpokit's on-policy distillation
(algo/distill.py, docs/DOMAINS.md): the student samples, the teacher scores the student's tokens.

TRL's DistillationConfig is a ``TrainingArguments`` whose own fields are GRPOConfig's generation,
vLLM and logging fields (same names, defaults and meaning), three teacher fields and ``beta``, which
there selects the divergence (0 forward KL, 1 reverse KL, between: generalized JSD), not a KL weight.
So ``DistillationConfig`` declares exactly those fields (the shared ones taken from GRPOConfig, with
its documentation) and ``grpo_arguments`` turns it into a GRPOConfig (which refuses, field by field,
what grpokit cannot carry out) plus the ``algo.distill_*`` settings:

* ``teacher_model_name_or_path`` (or the trainer's ``teacher_model`` folder or name) -> ``algo.distill_teacher``;
* ``beta=1`` (reverse KL) -> ``algo.distill_coef=1``, ``algo.distill_estimator=k1``: the per-token reverse
  KL on the sampled tokens as a reward (its on-policy estimate, where TRL sums over the vocabulary);
* ``beta=0`` (forward KL) -> ``algo.distill_top_k=distill_top_k``, ``algo.distill_coef=1``: the forward
  KL on the teacher's top-k (grpokit's own field ``distill_top_k``, which must be > 0: k = the vocabulary
  size is TRL's full sum); any other beta (the JSD) is refused;
* ``temperature`` is the sampling temperature and the distributions' (as TRL's; a generation_kwargs temperature
  changes sampling only, as TRL's, through algo.loss_temperature);
* no reward (``no_reward`` scores 0): GRPO's advantage is 0 and the distillation term is the whole objective. TRL
  samples one completion per prompt; grpokit samples ``num_generations`` (default 2) per prompt, the same
  completions per step over half the prompts.

``teacher_model_revision`` and ``teacher_model_init_kwargs`` are refused at any value but None (the
teacher is loaded as the student's dtype, from its folder or name).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import TrainingArguments

from grpokit.config.base import ConfigError
from grpokit.config.io import set_field

from .config import GRPOConfig

# TRL 1.16 DistillationConfig's own fields that GRPOConfig declares with the same default and meaning
SHARED = (
    "learning_rate bf16 gradient_checkpointing logging_steps remove_unused_columns model_init_kwargs "
    "trust_remote_code disable_dropout max_completion_length ds3_gather_for_generation shuffle_dataset "
    "pad_to_multiple_of temperature top_p top_k min_p generation_kwargs chat_template_kwargs repetition_penalty "
    "cache_implementation use_vllm vllm_mode vllm_model_impl vllm_enable_sleep_mode vllm_structured_outputs_regex "
    "vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout vllm_group_port "
    "vllm_gpu_memory_utilization vllm_max_model_length vllm_tensor_parallel_size max_tool_calling_iterations "
    "log_completions num_completions_to_print log_unique_prompts"
).split()
OWN_DOCS = {
    "teacher_model_name_or_path": "The teacher (a model folder, a named model or a LoRA adapter folder): "
    "algo.distill_teacher. It must share the student's tokenizer.",
    "teacher_model_revision": "Not carried out by grpokit: must stay None.",
    "teacher_model_init_kwargs": "Not carried out by grpokit: must stay None (the teacher loads in the student's "
    "dtype).",
    "beta": "TRL's divergence: 1.0 reverse KL (algo.distill_coef=1 with k1 on the sampled tokens), 0.0 forward KL "
    "(on the teacher's top-k: needs distill_top_k > 0); the generalized JSD in between is refused.",
    "distill_top_k": "grpokit's own: k of the forward KL on the teacher's top-k (beta=0.0): algo.distill_top_k.",
    "num_generations": "grpokit's own: completions sampled per prompt (TRL's DistillationTrainer samples one; "
    "grpokit's groups hold at least two).",
}


def _shared_field(name: str) -> tuple[str, Any, dataclasses.Field]:
    f = next(f for f in dataclasses.fields(GRPOConfig) if f.name == name)
    default = {"default": f.default} if f.default is not dataclasses.MISSING else {"default_factory": f.default_factory}
    return name, f.type, dataclasses.field(**default, metadata=dict(f.metadata))


def _own(name: str, kind: Any, default: Any) -> tuple[str, Any, dataclasses.Field]:
    return name, kind, dataclasses.field(default=default, metadata={"help": OWN_DOCS[name]})


DistillationConfig = dataclasses.make_dataclass(
    "DistillationConfig",
    [_shared_field(n) for n in SHARED]
    + [
        _own("teacher_model_name_or_path", "str | None", None),
        _own("teacher_model_revision", "str | None", None),
        _own("teacher_model_init_kwargs", "dict | str | None", None),
        _own("beta", float, 1.0),
        _own("distill_top_k", int, 0),
        _own("num_generations", int, 2),
    ],
    bases=(TrainingArguments,),
    namespace={"__doc__": "TRL's DistillationConfig: pass the arguments you would pass to trl.DistillationConfig."},
)
DistillationConfig.__module__ = __name__


def grpo_arguments(args: Any, teacher: str | None = None) -> tuple[GRPOConfig, dict[str, Any]]:
    """``(GRPOConfig, {algo.distill_*: value})`` of a DistillationConfig; ``teacher`` (the trainer's
    ``teacher_model``) replaces ``teacher_model_name_or_path``. Refused in one sentence each: a beta that is
    neither 0 nor 1, beta=0 without distill_top_k, no teacher, a teacher revision or init kwargs."""
    for name in ("teacher_model_revision", "teacher_model_init_kwargs"):
        if getattr(args, name) is not None:
            raise ConfigError(
                f"DistillationConfig {name}={getattr(args, name)!r} is not supported by grpokit; leave it None"
            )
    name = teacher or args.teacher_model_name_or_path
    if not name:
        raise ConfigError(
            "DistillationTrainer needs a teacher: pass teacher_model (a folder or a model name) or set "
            "DistillationConfig teacher_model_name_or_path"
        )
    if args.beta == 1.0:
        algo = {"algo.distill_coef": 1.0, "algo.distill_estimator": "k1", "algo.distill_top_k": 0}
    elif args.beta == 0.0 and args.distill_top_k > 0:
        algo = {"algo.distill_coef": 1.0, "algo.distill_top_k": args.distill_top_k}
    else:
        raise ConfigError(
            f"DistillationConfig beta={args.beta} (distill_top_k={args.distill_top_k}) is not supported by grpokit: "
            "use beta=1.0 (reverse KL) or beta=0.0 with distill_top_k > 0 (forward KL on the teacher's top-k)"
        )
    base = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainingArguments) if f.init}
    shared = {n: getattr(args, n) for n in SHARED}
    grpo = GRPOConfig(**{**base, **shared, "num_generations": args.num_generations, "beta": 0.0})
    return grpo, {"algo.distill_teacher": str(name), **algo}


def no_reward(completions: list, **kwargs: Any) -> list[float]:
    """Distillation's reward function: 0 for every completion, so GRPO's advantage is 0 and the
    distillation term is the whole objective (its metrics: ``rewards/no_reward/...``)."""
    return [0.0] * len(completions)


class DistillationTrainer:
    """TRL's DistillationTrainer on grpokit: a GRPOTrainer without reward functions whose run distils the
    teacher (``grpo_arguments``); every other attribute and method (train, save_model, state ...) is the
    GRPOTrainer's."""

    def __init__(
        self,
        model: Any,
        teacher_model: Any = None,
        args: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: list | None = None,
    ):
        from .trainer import GRPOTrainer

        if teacher_model is not None and not isinstance(teacher_model, str):
            raise ConfigError(
                f"DistillationTrainer teacher_model must be a folder or a model name for grpokit, got "
                f"{type(teacher_model).__name__}; save it (save_pretrained) and pass its folder"
            )
        if args is None:
            name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "")
            args = DistillationConfig(f"{str(name).rstrip('/').split('/')[-1]}-Distillation")
        grpo, algo = grpo_arguments(args, teacher_model)
        self._grpo = GRPOTrainer(
            model,
            reward_funcs=[no_reward],
            args=grpo,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
            tools=tools,
        )
        for field_name, value in algo.items():
            set_field(self._grpo.cfg, field_name, value)
        self.distillation_args = args

    def __getattr__(self, name: str) -> Any:
        if name == "_grpo":  # not yet set: __init__ failed before it
            raise AttributeError(name)
        return getattr(self._grpo, name)
