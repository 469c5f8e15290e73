"""The attributes TRL's GRPOTrainer.__init__ sets, on grpokit.trl's GRPOTrainer, with TRL's meaning.

Four kinds. Settings TRL copies from its GRPOConfig (``beta``, ``num_generations``, ``epsilon_low`` ...)
are read from the arguments: grpokit's stages read the config built from them, so setting one on
the trainer would change nothing and is refused in one sentence (``entropy_coef``, which TRL's
adaptive control moves, is the settable one). State TRL keeps current during training (``_metrics``,
``_step``, ``_total_train_tokens``, ``model_wrapped`` ...) is read from grpokit's run as it goes; assigning
one is refused in one sentence (``ref_model``, ``model`` and ``entropy_coef`` are assignable with TRL's
meaning). What TRL reads afresh at every batch and scripts change in place (``reward_funcs``,
``reward_weights``, ``generation_config``) is one object the run reads at every batch too, and what it
cannot follow (``reward_func_names``, ``tools``, ``eos_token_ids`` ...) is held read-only (held.py). What
TRL holds for machinery grpokit does not run (its vLLM client, its async loop, its tool registry, its Hub
commit scheduler) is None, as on a TRL run that does not use it; transformers' Trainer's own attributes
(``train_dataset``, ``optimizer``, ``data_collator`` ...) are trainer_attributes.py's.
"""

from __future__ import annotations

import inspect
import sys
from collections import defaultdict
from typing import Any

from grpokit.config.sections import ConfigError

from . import held, held_generation, held_rewards, trainer_attributes
from .assignable import INERT
from .surface import new_logs

# TRL's attribute -> the GRPOConfig field it copies (TRL's __init__: self.<name> = args.<field>)
FROM_ARGS = {
    name: name
    for name in (
        "beta num_generations num_generations_eval num_iterations loss_type scale_rewards importance_sampling_level "
        "mask_truncated_completions max_completion_length temperature top_p top_k min_p repetition_penalty use_vllm "
        "vllm_mode vllm_gpu_memory_utilization vllm_tensor_parallel_size vllm_importance_sampling_correction "
        "vllm_importance_sampling_mode vllm_importance_sampling_clip_min vllm_importance_sampling_clip_max "
        "top_entropy_quantile off_policy_mask_threshold shuffle_dataset log_completions num_completions_to_print "
        "log_unique_prompts multi_objective_aggregation chat_template_kwargs pad_to_multiple_of "
        "max_tool_calling_iterations use_transformers_continuous_batching log_multimodal use_adaptive_entropy"
    ).split()
}
FROM_ARGS["epsilon_low"] = "epsilon"


# TRL's defaults where it holds a field's None as something else
_NONE_AS = {
    "num_generations_eval": lambda a: a.num_generations,
    "max_tool_calling_iterations": lambda a: sys.maxsize,  # no limit: the run's env.max_turns=0 (args/sampling.py)
    "chat_template_kwargs": lambda a: {},
}


def _from_args(name: str, field: str) -> property:
    def get(self) -> Any:
        value = getattr(self.args, field, None)
        return _NONE_AS[name](self.args) if value is None and name in _NONE_AS else value

    def refuse(self, value: Any) -> None:
        raise ConfigError(
            f"GRPOTrainer.{name} is read from GRPOConfig.{field}, which grpokit's stages read at construction; "
            f"set {field}={value!r} in the GRPOConfig instead"
        )

    return property(get, refuse, doc=f"TRL's: GRPOConfig.{field}.")


def _epsilon_high(self) -> float:
    """TRL's: epsilon_high, or epsilon when it is None."""
    a = self.args
    return a.epsilon_high if a.epsilon_high is not None else a.epsilon


def _generation_kwargs(self) -> dict[str, Any]:
    """TRL's keywords of its transformers sampling path, from the sampling arguments and generation_kwargs
    (read-only: held.py)."""
    a, tok = self.args, self._tokenizer
    kwargs = dict(
        max_new_tokens=a.max_completion_length,
        do_sample=True,
        pad_token_id=getattr(tok, "pad_token_id", None),
        bos_token_id=getattr(tok, "bos_token_id", None),
        eos_token_id=self.eos_token_ids,
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=a.top_k,
        min_p=a.min_p,
        repetition_penalty=a.repetition_penalty,
        cache_implementation=a.cache_implementation,
    )
    return held.read_only("generation_kwargs", {**kwargs, **(a.generation_kwargs or {})})


def _tokenizer(self) -> Any:
    """TRL's: the tokenizer (a processor's own for a vision-language model)."""
    tok = self.processing_class
    return getattr(tok, "tokenizer", tok)


def _is_vlm(self) -> bool:
    """TRL's: the processing class is a multimodal processor."""
    from grpokit.data.vision import is_processor

    return is_processor(self.processing_class)


def _step(self) -> int:
    """TRL's micro-step count: training_step calls, per_device_train_batch_size rows each; inside an update
    its micro-batches so far join the updates' (stages.TrlLoss counts them per TRL step: ``_micro_at``)."""
    step, micro = self._micro_at
    done = micro if step == self.state.global_step else 0
    return self.state.global_step * self.args.gradient_accumulation_steps + done


def _metrics(self) -> dict[str, Any]:
    """TRL's ``_metrics``: per mode, each metric's values since the last log entry; the next entry logs
    their mean (a subclass appending to ``_metrics["train"][name]`` gets ``name`` logged, as under TRL)."""
    if self.bridge is None:
        return self._early_metrics
    return {"train": self.bridge.pending, "eval": self._early_metrics["eval"]}


STATE = {
    "epsilon_high": property(_epsilon_high),
    "generation_kwargs": property(_generation_kwargs, held.refused_setter("generation_kwargs")),
    "_entropy_bonus_enabled": property(
        lambda self: self.args.entropy_coef != 0.0 or self.args.use_adaptive_entropy,
        doc="TRL's: the entropy bonus is on (entropies then carry gradient in _get_per_token_logps_and_entropies).",
    ),
    "_tokenizer": property(_tokenizer),
    "_is_vlm": property(_is_vlm),
    "_step": property(_step),
    "_metrics": property(_metrics),
    "_total_train_tokens": property(lambda self: self.state.num_input_tokens_seen, doc="TRL's: tokens trained on."),
    "_last_loaded_step": property(
        lambda self: self.state.global_step, doc="TRL's: the step whose weights the sampler holds (every step's)."
    ),
    "model_wrapped": property(lambda self: self.model, doc="transformers': the model as the loop runs it."),
}


HELD = {
    "reward_funcs": held_rewards.REWARD_FUNCS,
    "reward_weights": held_rewards.REWARD_WEIGHTS,
    "generation_config": held_generation.GENERATION_CONFIG,
    **held.PROPERTIES,
}
"""What TRL holds as one object a script may change in place: honoured at every batch, or read-only."""


def install(cls: type) -> type:
    """Add TRL's attributes to ``cls`` (grpokit.trl's GRPOTrainer) as properties, transformers' Trainer's too."""
    for name, field in FROM_ARGS.items():
        setattr(cls, name, _from_args(name, field))
    for name, prop in {**STATE, **HELD, **trainer_attributes.properties()}.items():
        setattr(cls, name, prop)
    for name in dir(cls):  # the rest of what the run holds: assigning it is refused in one sentence
        prop = inspect.getattr_static(cls, name)
        if isinstance(prop, property) and prop.fset is None:
            setattr(cls, name, property(prop.fget, _read_only(name), doc=prop.__doc__))
    return cls


def _read_only(name: str) -> Any:
    def refuse(self, value: Any) -> None:
        raise ConfigError(
            f"GRPOTrainer.{name} is read from grpokit's run as it goes (TRL's meaning); it cannot be assigned "
            f"(a subclass can read it, or keep its own value under another name)"
        )

    return refuse


def init_state(facade: Any, funcs: list, tools: Any, environment_factory: Any, rollout_func: Any) -> None:
    """The attributes TRL sets once at construction: the inert ones None, the inputs as TRL holds them."""
    import asyncio

    for name in INERT:
        setattr(facade, name, None)
    facade._early_metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    facade._pending_extra_logs = defaultdict(list)
    facade._current_train_step_time = 0.0
    facade._standalone_tools = list(tools or [])
    facade._multi_environment = isinstance(environment_factory, dict)
    factories = (
        None
        if environment_factory is None
        else environment_factory
        if isinstance(environment_factory, dict)
        else {None: environment_factory}
    )
    held.init(facade, funcs, tools, factories)  # tools, environment_factories, reward names: read-only
    facade._env_tools, facade._environment_pool = {}, {}
    facade.rollout_func = rollout_func
    facade._has_async_funcs = any(asyncio.iscoroutinefunction(f) for f in list(funcs) + facade.tools)


def init_trl_attributes(facade: Any, funcs: list) -> None:
    """What TRL's GRPOTrainer holds from construction and scripts read: the rolling completion
    logs, the entropy bonus switches, the reward functions' names and tokenizers, the summary."""
    a = facade.args  # TRL keeps one generation batch of completions
    facade._logs = new_logs(
        a.generation_batch_size
        or a.per_device_train_batch_size * (a.steps_per_generation or a.gradient_accumulation_steps)
    )
    """TRL's rolling log of the latest completions: prompt, completion, rewards, advantages, extra."""
    facade._evaluating = False  # evaluate() runs: its samples are not TRL's training tokens
    facade._pending_metrics: dict[str, list[float]] = {}  # log_metric's values until the next log entry
    facade._reward_call = facade._last_scored = None  # stages.TrlRewards' batch while _calculate_rewards runs
    facade._loss_call = None  # stages.TrlLoss' update while compute_loss runs
    facade._micro_at = (-1, 0)  # (TRL step, its micro-batches done) of the update stages.TrlLoss runs
    # generation.py's prompts while the subclass's method runs, and what super() sampled
    facade._gen_call = facade._gen_scored = facade._turn_finish = None
    facade._generation_batch: dict | None = None  # the subclass's last generation batch (TRL's dict)
    facade._buffered_inputs: list | None = None
    """TRL's: the generation batch cut into steps_per_generation dicts (set when the subclass makes it)."""
    facade.current_gradient_accumulation_steps = facade.args.gradient_accumulation_steps
    facade.summary: dict[str, Any] = {}
    """grpokit's run summary (steps ...), set by ``train()``."""
    held_rewards.init(facade, funcs)  # reward_funcs and reward_weights: read by the reward stage at every batch
    vars(facade)["_generation_config"] = None  # TRL's, made on first read from the arguments as they now stand
    vars(facade).setdefault("_sampling_written", {})  # its sampled fields written so far (held_generation.py)
