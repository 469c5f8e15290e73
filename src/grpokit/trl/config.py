"""TRL 1.16's ``GRPOConfig`` for grpokit: a ``transformers.TrainingArguments``, as TRL's is.

It subclasses ``TrainingArguments`` and declares TRL's GRPO arguments with TRL's types and defaults,
so everything that reads a TRL config reads this one: transformers' ``HfArgumentParser`` and TRL's
``TrlParser`` build it from a command line or a YAML file (``--help`` lists every field), a project
subclasses it with its own fields, and scripts read ``process_index``, ``world_size``, ``device``,
``get_process_log_level()``, ``main_process_first()``, ``to_dict()`` ... as on TRL's. Measured
(docs/TRL.md): ``import grpokit.trl`` already imported transformers' training arguments, and a
``GRPOConfig`` takes 24 ms to build the first time, 1.2 ms after, so subclassing adds nothing
noticeable.

grpokit carries out the arguments in ``SUPPORTED`` (mapping.py maps them onto ``Config`` with the rules of
args/, one module per group of arguments; each group also holds its arguments' checks, which this class runs).
The fields are declared here in TRL's order, which is TRL's API: positional arguments and
``HfArgumentParser``'s ``--help`` follow it. Every other
field, TRL's or transformers', is accepted only at its default (``UNSUPPORTED``): any other value is
refused with one sentence naming it, never silently ignored. A name neither has is refused too.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import typing
from dataclasses import dataclass
from typing import Any

from transformers import TrainingArguments

from grpokit.config.base import ConfigError

from .args.checks import GATES, REFUSED_WHY, check, check_gated, kind_of
from .args.inherited import INHERITED
from .field_help import help_from_docstrings


@dataclass
class GRPOConfig(TrainingArguments):
    """TRL's GRPOConfig: pass the arguments you would pass to ``trl.GRPOConfig``; subclass it as TRL's."""

    # TRL's defaults for TrainingArguments fields, then TRL's own GRPO fields (TRL's order, TRL's types)
    learning_rate: float = 1e-06
    """Peak AdamW learning rate."""
    bf16: bool | None = None
    """bfloat16 mixed precision (None: grpokit's auto, bf16 autocast on GPU only)."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass."""
    logging_steps: float = 10
    """Console line (and completion samples, with log_completions) every N steps; a value in (0, 1) is a
    fraction of the steps."""
    remove_unused_columns: bool | None = False
    """True: reward functions see only the prompt, no other dataset column."""
    model_init_kwargs: dict[str, Any] | str | None = None
    """Loading options for a model given by name; grpokit reads dtype (or torch_dtype)."""
    trust_remote_code: bool = False
    """Allow model code from the Hub."""
    router_aux_loss_coef: float | None = None
    """Mixture-of-Experts router load-balancing loss weight (None: the model config's own; 0: off); refused for
    a model without a router."""
    disable_dropout: bool = False
    """Set every dropout probability of the policy to 0."""
    cast_lm_head_to_fp32: bool = False
    """ScaleRL: the output layer (weights and logits) of the policy and reference in float32 (model.lm_head_fp32)."""
    num_generations: int | None = 8
    """G: completions per prompt."""
    num_generations_eval: int | None = None
    """Completions per eval prompt (None: num_generations)."""
    max_completion_length: int | None = 512
    """Most tokens per completion."""
    ds3_gather_for_generation: bool = True
    """Accepted; no effect: TRL reads it under DeepSpeed ZeRO-3 only, which grpokit does not run (deepspeed is
    refused)."""
    shuffle_dataset: bool | None = True
    """Shuffle the training prompts each epoch."""
    pad_to_multiple_of: int | str | None = "auto"
    """Accepted; no effect: padding changes no log-prob, loss or gradient (grpokit chooses its own padding or
    packing)."""
    generation_batch_size: int | None = None
    """Completions sampled at once (None: per_device_train_batch_size * steps_per_generation * processes); set
    it or steps_per_generation, not both."""
    steps_per_generation: int | None = None
    """Optimizer steps' worth of micro-batches sampled at once (None: gradient_accumulation_steps); one
    generation batch feeds steps_per_generation / gradient_accumulation_steps optimizer steps (not a whole
    number: an optimizer step may span two generation batches, as TRL's loop)."""
    temperature: float = 1.0
    """Sampling temperature, and the trained log-probabilities' (a generation_kwargs temperature samples apart)."""
    top_p: float = 1.0
    """Nucleus sampling (1.0: off)."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    min_p: float | None = None
    """Min-p sampling (None: off)."""
    generation_kwargs: dict | str | None = None
    """More sampling settings; grpokit reads temperature, top_p, top_k, min_p, max_new_tokens, stop_strings and
    repetition_penalty (sampling only, as TRL: the loss keeps temperature and max_completion_length)."""
    chat_template_kwargs: dict | str | None = None
    """Extra keyword arguments of apply_chat_template for conversational prompts."""
    repetition_penalty: float = 1.0
    """Penalty on tokens already in the prompt or completion (1.0: off), applied to sampling only."""
    cache_implementation: str | None = None
    """The KV cache of sampling, as TRL's generation_config: "static" (rollout.engine static), "dynamic"
    (engine dynamic), another transformers cache ("offloaded", "sliding_window" ...) samples through
    model.generate with it (engine generate); None: grpokit's choice."""
    use_vllm: bool = False
    """Sample with vLLM."""
    vllm_mode: str = "colocate"
    """"colocate" (an engine on the trainer's GPU) or "server"."""
    vllm_model_impl: str = "vllm"
    """Which model code vLLM runs ('vllm' or 'transformers'). grpokit's vLLM engine runs vLLM's own: accepted
    only at TRL's default ('vllm')."""
    vllm_enable_sleep_mode: bool = False
    """Release the colocated engine's memory during the update."""
    vllm_structured_outputs_regex: str | None = None
    """A regular expression vLLM's guided decoding holds every completion to. Not carried out by grpokit:
    accepted only at TRL's default (None)."""
    vllm_server_base_url: str | None = None
    """Server URL (None: from vllm_server_host and vllm_server_port)."""
    vllm_server_host: str = "0.0.0.0"
    """Server host when vllm_server_base_url is None."""
    vllm_server_port: int = 8000
    """Server port when vllm_server_base_url is None."""
    vllm_server_timeout: float = 240.0
    """Seconds to wait for the server."""
    vllm_group_port: int = 51216
    """Port of TRL's weight-sync process group with a vLLM server. grpokit's server sync uses its own: accepted
    only at TRL's default (51216)."""
    vllm_gpu_memory_utilization: float = 0.3
    """GPU memory fraction of the colocated engine."""
    vllm_max_model_length: int | None = None
    """Colocate mode: the engine's max_model_len, prompt plus completion tokens (None: the model's own)."""
    vllm_tensor_parallel_size: int = 1
    """GPUs per vLLM engine: in colocate mode each group of this many consecutive processes shares one engine
    (must divide their number); in server mode the server's own --tensor-parallel-size decides (as TRL)."""
    beta: float = 0.0
    """KL coefficient (0: no reference model)."""
    num_iterations: int = 1
    """mu: updates per generated batch."""
    epsilon: float = 0.2
    """Lower clip of the ratio (1 - epsilon)."""
    delta: float | None = None
    """Two-sided clipping: the ratio of a negative-advantage token is capped at delta (must exceed 1 +
    epsilon_high; None: off)."""
    epsilon_high: float | None = None
    """Upper clip of the ratio (None: epsilon)."""
    sapo_temperature_neg: float = 1.05
    """loss_type="sapo": gate temperature for tokens with negative advantage."""
    sapo_temperature_pos: float = 1.0
    """loss_type="sapo": gate temperature for tokens with positive advantage."""
    vespo_k_pos: float = 2.0
    """loss_type='vespo': shape k of the gamma weight where the advantage is >= 0."""
    vespo_lambda_pos: float = 3.0
    """loss_type='vespo': rate lambda of the gamma weight where the advantage is >= 0."""
    vespo_k_neg: float = 3.0
    """loss_type='vespo': shape k of the gamma weight where the advantage is < 0."""
    vespo_lambda_neg: float = 2.0
    """loss_type='vespo': rate lambda of the gamma weight where the advantage is < 0."""
    importance_sampling_level: str = "token"
    """"token" (GRPO) or "sequence" (GSPO)."""
    reward_weights: list[float] | None = None
    """One weight per reward function (None: all 1.0)."""
    multi_objective_aggregation: str = "sum_then_normalize"
    """"sum_then_normalize" (weighted sum, then the group baseline) or "normalize_then_sum" (GDPO: each reward
    normalised in its group, summed, then whitened over the batch)."""
    scale_rewards: str = "group"
    """"group" (or True), "batch" or "none" (or False)."""
    loss_type: str = "dapo"
    """"grpo", "dapo", "bnpo", "dr_grpo", "cispo" (epsilon_high, or epsilon when unset, caps the weight),
    "sapo", "luspo" or "vespo"."""
    mask_truncated_completions: bool = False
    """Leave truncated completions out of the loss (DAPO)."""
    sync_ref_model: bool = False
    """Refresh the reference model every ref_model_sync_steps (grpokit copies: needs ref_model_mixup_alpha=1.0)."""
    ref_model_mixup_alpha: float = 0.6
    """TR-DPO mix of policy into reference; grpokit carries out only 1.0 (a copy)."""
    ref_model_sync_steps: int = 512
    """Steps between reference refreshes."""
    top_entropy_quantile: float = 1.0
    """Train only on this top fraction of tokens by entropy."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (TRL's plain token mean); with use_adaptive_entropy the starting coefficient."""
    use_adaptive_entropy: bool = False
    """Skywork-OR1 adaptive entropy control: after each optimizer step the coefficient rises by
    entropy_coef_delta when the loss tokens' mean entropy was at or below entropy_target, else falls by it; the
    next step applies it only while that entropy is at or below the target."""
    entropy_coef_min: float = 0.0
    """Adaptive entropy control: lowest coefficient."""
    entropy_coef_max: float = 1.0
    """Adaptive entropy control: highest coefficient."""
    entropy_coef_delta: float = 0.005
    """Adaptive entropy control: change of the coefficient per optimizer step."""
    entropy_target: float = 0.2
    """Adaptive entropy control: target mean token entropy (nats)."""
    max_tool_calling_iterations: int | None = None
    """Most tool-calling rounds per episode (None: no limit, as TRL; max_completion_length bounds the episode)."""
    vllm_importance_sampling_correction: bool = True
    """Correct for the vLLM/trainer mismatch with importance weights (only with use_vllm)."""
    vllm_importance_sampling_mode: str = "sequence_mask"
    """token_truncate, token_mask, sequence_truncate or sequence_mask (rollout.tis_mode; sequence ratios are
    products of token ratios)."""
    vllm_importance_sampling_clip_max: float | None = 3.0
    """Upper bound of the importance weight: truncated to it or masked above it (None: no bound)."""
    vllm_importance_sampling_clip_min: float | None = None
    """Lower bound of the importance weight: truncated to it or masked below it (None: no bound)."""
    off_policy_mask_threshold: float | None = None
    """DeepSeek-V3.2 off-policy sequence masking threshold."""
    use_bias_correction_kl: bool = True
    """Multiply the KL term by the importance ratio (DeepSeek-V3.2)."""
    log_completions: bool = False
    """Write prompts with their completions (samples.jsonl) every logging_steps."""
    log_multimodal: bool = True
    """With log_completions, image prompts' sample rows get their image (record.samples_images: images/*.png, named
    in samples.jsonl's image column, shown by the report), as TRL logs images with its completions; False: text
    only."""
    num_completions_to_print: int | None = None
    """Completions per sample dump with log_completions (rounded up to whole groups; None: grpokit's 2 prompts)."""
    log_unique_prompts: bool = False
    """Accepted: grpokit's samples already hold each prompt once, with its group of completions."""
    log_completions_hub_repo: str | None = None
    """A Hub dataset repository TRL uploads the logged completions to. Not carried out by grpokit: accepted
    only at TRL's default (None)."""
    use_transformers_continuous_batching: bool = False
    """Sample with a continuous-batching engine: grpokit's own decode loop, which already drops finished rows
    from the batch (the same sampling distribution; TRL refuses it for vision models, and so does grpokit)."""
    transformers_continuous_batching_config: dict | str | None = None
    """transformers' ContinuousBatchingConfig keywords (memory and block sizes of its paged cache): checked as
    transformers checks them; grpokit's decode loop has no paged cache to size."""
    use_transformers_paged: bool = False
    """Deprecated alias of use_transformers_continuous_batching (TRL 1.16): True sets it, with TRL's FutureWarning."""
    vllm_importance_sampling_cap: float | None = None
    """Deprecated alias of vllm_importance_sampling_clip_max (TRL 1.16): when set, it replaces it."""

    # transformers parses these from a JSON string (a command line's --model_init_kwargs '{"dtype": ...}'), as TRL's
    _VALID_DICT_FIELDS = TrainingArguments._VALID_DICT_FIELDS + [
        "model_init_kwargs",
        "transformers_continuous_batching_config",
        "generation_kwargs",
        "chat_template_kwargs",
    ]

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # the constructor's values as a subclass's __post_init__ left them
            if f.name in self.__dict__:
                self.__dict__[f.name] = self._checked_value(f.name, self.__dict__[f.name])
        self.__dict__["_checked"] = True
        self.__dict__["_initialising"] = True  # transformers' own attributes (mixed_precision ...) are set in here
        for name in self._VALID_DICT_FIELDS:  # a JSON string transformers would fail on with a parser's traceback
            value = getattr(self, name)
            if isinstance(value, str) and value.startswith("{"):
                try:
                    json.loads(value)
                except ValueError:
                    raise ConfigError(
                        f"GRPOConfig argument {name}={value!r} is not supported by grpokit; "
                        "valid: None, a dict or a JSON object string"
                    ) from None
        # the name the user wrote (transformers then copies it over); getattr: an older transformers lacks the new one
        self.__dict__["_checkpointing_kwargs_name"] = (
            "activation_checkpointing_kwargs"
            if getattr(self, "activation_checkpointing_kwargs", None) is not None
            else "gradient_checkpointing_kwargs"
        )
        self._check_choices()
        from .best import check_args  # grpokit's sentences before transformers' own check of the same rule

        check_args(self)
        try:
            super().__post_init__()
        except ConfigError:
            raise
        except ValueError as e:  # transformers' refusals (both fp16 and bf16 ...): one sentence, not a traceback
            raise ConfigError(f"GRPOConfig: {' '.join(str(e).split())}") from None
        if isinstance(self.pad_to_multiple_of, str) and self.pad_to_multiple_of != "auto":  # a command line's text
            text = self.pad_to_multiple_of.strip().lower()
            self.pad_to_multiple_of = None if text in ("none", "null") else int(text)
        if self.pad_to_multiple_of == "auto":  # TRL: 128 on Neuron devices only; it pads nothing here either
            self.pad_to_multiple_of = None
        for name, value in list(self.__dict__.items()):  # named choices as plain strings, equal to transformers'
            if isinstance(value, enum.Enum):  # str enums (grpokit's Config and messages hold the text)
                self.__dict__[name] = value.value
        self._fill_generation_batch()
        if self.vllm_importance_sampling_cap is not None:  # TRL 1.16's deprecated alias (warned by the trainer)
            self.vllm_importance_sampling_clip_max = self.vllm_importance_sampling_cap
        del self.__dict__["_initialising"]
        check_gated(self)  # the fields TRL reads only with another argument on, now that all are set
        self.__dict__["_complete"] = True

    def _check_choices(self) -> None:
        """A named choice transformers does not know (``eval_strategy="best"``), refused in grpokit's words."""
        from transformers.trainer_utils import HubStrategy, IntervalStrategy, SaveStrategy, SchedulerType
        from transformers.training_args import OptimizerNames

        for name, kind in (
            ("eval_strategy", IntervalStrategy),
            ("logging_strategy", IntervalStrategy),
            ("save_strategy", SaveStrategy),
            ("hub_strategy", HubStrategy),
            ("lr_scheduler_type", SchedulerType),
            ("optim", OptimizerNames),
        ):
            value, valid = getattr(self, name), [m.value for m in kind]
            if value not in valid:
                raise ConfigError(f"GRPOConfig argument {name}={value!r} is not valid; use one of {', '.join(valid)}")

    def _fill_generation_batch(self) -> None:
        """TRL's resolution of steps_per_generation and generation_batch_size: given one, the other follows."""
        per_pass = self.per_device_train_batch_size * self.world_size
        if self.steps_per_generation is not None and self.generation_batch_size is not None:
            raise ConfigError(
                "GRPOConfig arguments steps_per_generation and generation_batch_size are both set; set one of them"
            )
        self.__dict__["_derived"] = (
            ("steps_per_generation", None)
            if self.generation_batch_size is not None
            else ("generation_batch_size", None)
        )
        if self.generation_batch_size is not None:
            if self.generation_batch_size % per_pass:
                raise ConfigError(
                    f"GRPOConfig argument generation_batch_size={self.generation_batch_size} is not a multiple of "
                    f"per_device_train_batch_size * processes = {per_pass}; make it one"
                )
            self.steps_per_generation = self.generation_batch_size // per_pass
        else:
            self.steps_per_generation = self.steps_per_generation or self.gradient_accumulation_steps
            self.generation_batch_size = per_pass * self.steps_per_generation
        name = self.__dict__["_derived"][0]  # args/batch.py re-derives it when the process count differs at run time
        self.__dict__["_derived"] = (name, getattr(self, name))

    def _validate_args(self) -> None:
        # grpokit runs bfloat16 autocast on a CPU too, where transformers refuses bf16=True without use_cpu
        bf16 = self.bf16
        self.__dict__["bf16"] = bool(bf16) and (self.use_cpu or _bf16_device())
        try:
            super()._validate_args()
        finally:
            self.__dict__["bf16"] = bf16

    def __setattr__(self, name: str, value: Any) -> None:
        """Arguments set after construction (``args.model_init_kwargs = ...``, as TRL's scripts do) get
        the same checks as constructor arguments: nothing set on the config is silently ignored."""
        fields = _field_names(type(self))
        if name not in fields:
            if name in self.__dict__ or name.startswith("_") or self.__dict__.get("_initialising"):
                object.__setattr__(self, name, value)  # transformers' and TRL's own attributes
                return
            raise ConfigError(f"GRPOConfig got {name!r}, which is not an argument of TRL 1.16's GRPOConfig")
        if "_checked" not in self.__dict__:  # the constructor's values, and a subclass's __post_init__ filling them in
            object.__setattr__(self, name, value)  # before ours (as TRL lets it): checked as they end, in __post_init__
            return
        object.__setattr__(self, name, self._checked_value(name, value))

    def _checked_value(self, name: str, value: Any) -> Any:
        if name in UNSUPPORTED and not self.__dict__.get("_initialising") and not _same(value, UNSUPPORTED[name]):
            why = f" ({REFUSED_WHY[name]})" if name in REFUSED_WHY else " (docs/TRL.md lists what is supported)"
            raise ConfigError(
                f"GRPOConfig argument {name}={value!r} is not supported by grpokit; "
                f"leave it at TRL's default {UNSUPPORTED[name]!r}{why}"
            )
        if name == "scale_rewards":  # TRL takes True / False for "group" / "none"
            value = {True: "group", False: "none", "true": "group", "false": "none"}.get(value, value)
        check(name, value, _ANNOTATIONS.get(name, ""))
        if name in GATES and self.__dict__.get("_complete"):  # set after construction: checked if read now
            check_gated(self, (name,), value=value)
        return value


def _bf16_device() -> bool:
    from transformers.utils import is_torch_bf16_gpu_available

    return is_torch_bf16_gpu_available()


_generated_init = GRPOConfig.__init__


@functools.wraps(_generated_init)
def _init(self: GRPOConfig, *args: Any, **kwargs: Any) -> None:
    unknown = [k for k in kwargs if k not in _field_names(type(self))]
    if unknown and type(self) is GRPOConfig:  # a subclass's own __init__ raises TypeError for it, as TRL's
        raise ConfigError(f"GRPOConfig got {unknown[0]!r}, which is not an argument of TRL 1.16's GRPOConfig")
    _generated_init(self, *args, **kwargs)


GRPOConfig.__init__ = _init  # type: ignore[method-assign]


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


_REFUSED_OWN = ("vllm_model_impl", "vllm_structured_outputs_regex", "log_completions_hub_repo")
_OWN = tuple(n for n in GRPOConfig.__dict__["__annotations__"] if not n.startswith("_"))
# INHERITED names the newest transformers' fields; an older one lacks some (transformers 5.17 has no
# activation_checkpointing*): only the fields this version's TrainingArguments has are carried out
SUPPORTED = (frozenset(INHERITED) & _field_names(TrainingArguments)) | (frozenset(_OWN) - frozenset(_REFUSED_OWN))
# every other field (TRL's or transformers', today's or a later version's) only at its default
UNSUPPORTED: dict[str, Any] = {
    f.name: _default(f) for f in dataclasses.fields(GRPOConfig) if f.init and f.name not in SUPPORTED
}
_HINTS = typing.get_type_hints(GRPOConfig)
_ANNOTATIONS = {
    name: kind_of(_HINTS[name]) for name in SUPPORTED - {"fsdp"}
}  # "bool", "str | None" ... (args/checks.py); fsdp also accepts True


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default) or (value in (None, [], "", {}) and default in (None, [], "", {}))
    except Exception:  # an object that cannot be compared is not the default
        return False


help_from_docstrings(GRPOConfig)
