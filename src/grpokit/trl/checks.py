"""Single-value checks of TRL's GRPOConfig arguments, run when an argument is set.

A value no run can use (``learning_rate=inf``, ``num_generations=0``, ``reward_weights=[nan]``) is
refused with one sentence naming the argument, the value and what is valid, instead of a silent
acceptance or a Python error deep in training. Checks that involve two arguments stay in
the mapping's rules (mapping.py, *_rules.py), where the values are combined; a field TRL reads only while
another argument is on (``GATES``: vllm_* with use_vllm, vespo_* with loss_type vespo ...) is checked only
then, as TRL ignores it otherwise.
"""

from __future__ import annotations

import math
import os
import typing
from dataclasses import dataclass
from typing import Any, Callable

from grpokit.algo.tis import TIS_MODES
from grpokit.config.sections import ConfigError


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _at_least(lo: float, integer: bool = False, none: bool = False) -> Callable[[Any], bool]:
    return lambda x: (none and x is None) or ((_int(x) if integer else _num(x)) and x >= lo)


def _above(lo: float, none: bool = False) -> Callable[[Any], bool]:
    return lambda x: (none and x is None) or (_num(x) and x > lo)


def _in(lo: float, hi: float, none: bool = False) -> Callable[[Any], bool]:
    return lambda x: (none and x is None) or (_num(x) and lo <= x <= hi)


LOG_LEVELS = ("passive", "detail", "debug", "info", "warning", "error", "critical")  # transformers' log_level values

CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "learning_rate": (
        _above(0),
        "a finite number > 0 (TRL runs 0 too, and trains nothing: every update is lr * something = 0)",
    ),
    "delta": (
        _above(1, none=True),
        "None or a finite number > 1 (TRL runs a delta <= 1 too, but it caps the on-policy ratio 1: no gradient)",
    ),
    "ref_model_mixup_alpha": (lambda x: _num(x) and 0 < x <= 1, "a number in (0, 1]"),
    "vespo_k_pos": (_at_least(0), "a finite number >= 0"),
    "vespo_k_neg": (_at_least(0), "a finite number >= 0"),
    "vespo_lambda_pos": (_above(0), "a finite number > 0"),
    "vespo_lambda_neg": (_above(0), "a finite number > 0"),
    "num_completions_to_print": (lambda x: x is None or _int(x), "None or an integer (<= 0: print none, as TRL)"),
    "pad_to_multiple_of": (
        lambda x: x in (None, "auto") or (_int(x) and x != 0),
        "None, 'auto' or a non-zero integer (0 divides by zero in TRL)",
    ),
    "steps_per_generation": (_at_least(1, integer=True, none=True), "None or an integer >= 1"),
    "generation_batch_size": (_at_least(1, integer=True, none=True), "None or an integer >= 1"),
    "weight_decay": (_at_least(0), "a finite number >= 0 (TRL runs a negative one too, growing every weight)"),
    "adam_beta1": (_in(0, 1), "a number in [0, 1]"),
    "adam_beta2": (_in(0, 1), "a number in [0, 1]"),
    "adam_epsilon": (_at_least(0), "a finite number >= 0"),
    "max_grad_norm": (_num, "a finite number (<= 0: no clipping, as transformers)"),
    "warmup_steps": (_at_least(0), "a finite number >= 0"),
    "num_train_epochs": (_num, "a finite number (read when max_steps <= 0, where it must be > 0)"),
    "max_steps": (_int, "an integer (<= 0: use num_train_epochs, as transformers)"),
    "per_device_train_batch_size": (_at_least(1, integer=True), "an integer >= 1"),
    "per_device_eval_batch_size": (_at_least(1, integer=True), "an integer >= 1"),
    "gradient_accumulation_steps": (_at_least(1, integer=True), "an integer >= 1"),
    "num_generations": (_at_least(2, integer=True), "an integer >= 2 (a group needs two completions to compare)"),
    "num_generations_eval": (
        lambda x: x is None or (_int(x) and x >= 0),
        "None or an integer >= 0 (None or 0: num_generations, as TRL)",
    ),
    "num_iterations": (_at_least(1, integer=True), "an integer >= 1"),
    "max_completion_length": (
        _at_least(1, integer=True),
        "an integer >= 1 (TRL runs None too: transformers then stops sampling at the model's generation_config "
        "max_length, 20 tokens counting the prompt unless the model sets it, and loss_type dr_grpo fails)",
    ),
    "temperature": (_above(0), "a finite number > 0"),
    "top_p": (
        lambda x: _num(x) and 0 < x,
        "a number > 0 (above 1: off, as 1 and transformers; TRL runs 0 too: it keeps only the most likely token, "
        "so every completion of a group is the same and every advantage 0)",
    ),
    "top_k": (_at_least(-1, integer=True), "an integer >= -1 (0 or -1: off, -1 as vLLM)"),
    "min_p": (_in(0, 1, none=True), "None or a number in [0, 1]"),
    "repetition_penalty": (_above(0), "a finite number > 0"),
    "beta": (
        _at_least(0),
        "a finite number >= 0 (TRL runs a negative beta too, rewarding divergence from the reference)",
    ),
    "epsilon": (_at_least(0), "a finite number >= 0 (TRL runs a negative one too, with an empty clipping range)"),
    "epsilon_high": (
        _at_least(0, none=True),
        "None or a finite number >= 0 (TRL runs a negative one too, clipping every ratio below 1)",
    ),
    "top_entropy_quantile": (
        _above(0),
        "a number > 0 (1 or above: every token, as TRL; TRL runs 0 too, training only on the batch's single "
        "highest-entropy token)",
    ),
    "entropy_coef": (_num, "a finite number (negative: an entropy penalty, as TRL's loss - entropy_coef * H)"),
    "entropy_coef_min": (_at_least(0), "a finite number >= 0"),
    "neftune_noise_alpha": (_at_least(0, none=True), "None or a finite number >= 0"),
    "router_aux_loss_coef": (_at_least(0, none=True), "None (the model's own) or a finite number >= 0"),
    "entropy_coef_max": (_at_least(0), "a finite number >= 0"),
    "entropy_coef_delta": (_at_least(0), "a finite number >= 0"),
    "entropy_target": (_at_least(0), "a finite number >= 0 (nats)"),
    "off_policy_mask_threshold": (
        _at_least(0, none=True),
        "None or a finite number >= 0 (TRL runs a negative one too: it drops every negative-advantage completion "
        "whose mean log-ratio exceeds it, on-policy all of them, as that ratio is 0 there)",
    ),
    "logging_steps": (  # transformers: below 1 is ceil(steps * value), a negative period read as its size
        lambda x: _num(x) and x != 0,
        "a number other than 0 (below 1: a fraction of the steps)",
    ),
    "save_steps": (
        _num,
        "a finite number (below 1: a fraction of the steps; <= 0: no step checkpoint, as transformers)",
    ),
    "eval_steps": (  # transformers replaces None and 0 by logging_steps; a negative one is a period as logging_steps'
        lambda x: x is None or (_num(x) and x != 0),
        "None or a number other than 0 (below 1: a fraction of the steps)",
    ),
    "save_total_limit": (
        lambda x: x is None or _int(x),
        "None or an integer (None or <= 0: keep every checkpoint, as transformers)",
    ),
    "ref_model_sync_steps": (_at_least(1, integer=True), "an integer >= 1"),
    "seed": (_int, "an integer"),
    "data_seed": (lambda x: x is None or _int(x), "None or an integer"),
    "eval_delay": (_num, "a finite number (<= 0: no delay, as transformers)"),
    "metric_for_best_model": (
        lambda x: x is None or (isinstance(x, str) and x.strip() != ""),
        "None or a metric name such as 'loss' or 'eval_reward'",
    ),
    "vllm_tensor_parallel_size": (_at_least(1, integer=True), "an integer >= 1"),
    "vllm_max_model_length": (_at_least(1, integer=True, none=True), "None or an integer >= 1"),
    "vllm_importance_sampling_cap": (_above(0, none=True), "None or a finite number > 0"),
    "ddp_timeout": (_above(0), "a number of seconds > 0"),
    "include_num_input_tokens_seen": (
        lambda x: x in ("no", "all", "non_padding") or isinstance(x, bool),
        "'no', 'all', 'non_padding', True or False",
    ),
    "torch_empty_cache_steps": (_at_least(1, integer=True, none=True), "None or an integer >= 1"),
    "log_level": (lambda x: x in LOG_LEVELS, "one of " + ", ".join(LOG_LEVELS)),
    "log_level_replica": (lambda x: x in LOG_LEVELS, "one of " + ", ".join(LOG_LEVELS)),
    "project": (lambda x: isinstance(x, str) and x.strip() != "", "a non-empty project name"),
    "reward_weights": (
        lambda x: x is None or (isinstance(x, (list, tuple)) and all(_num(w) for w in x)),
        "None or a list of finite numbers, one per reward function",
    ),
    "hub_strategy": (
        lambda x: x in ("every_save", "end"),
        "'every_save' or 'end' (a grpokit checkpoint resumes only inside its run folder, so one pushed alone "
        "could not be resumed from as transformers' last-checkpoint is)",
    ),
    "vllm_group_port": (
        lambda x: x == 51216,
        "TRL's default 51216 (grpokit's vLLM server client sends the weights without TRL's NCCL group)",
    ),
    # named choices, checked when set (TRL reads some only with another argument, e.g. vllm_mode with use_vllm)
    "vllm_mode": (lambda x: x in ("colocate", "server"), "'colocate' or 'server'"),
    "importance_sampling_level": (lambda x: x in ("token", "sequence"), "'token' or 'sequence'"),
    "vllm_importance_sampling_mode": (lambda x: x in TIS_MODES, "one of " + ", ".join(TIS_MODES)),
}


# Why grpokit refuses a field's other values where TRL runs them: the sentence says what TRL does there
REFUSED_WHY = {
    "bf16_full_eval": "TRL runs True: transformers casts the whole model to bfloat16 in place at an evaluate() "
    "outside train(), and a later train() goes on from the cast weights; grpokit evaluates in the training dtype",
    "fp16_full_eval": "TRL runs True: transformers casts the whole model to float16 in place at an evaluate() "
    "outside train(), and a later train() goes on from the cast weights; grpokit evaluates in the training dtype",
}


@dataclass(frozen=True)
class Gate:
    """The arguments that make TRL read a gated field: ``on(args)`` is True when it reads it."""

    args: tuple[str, ...]
    on: Callable[[Any], bool]
    off: dict[str, Any] | None = None  # an any-of gate: each argument's off value (the words name those not off)

    def words(self, a: Any) -> str:
        names = [n for n in self.args if self.off is None or getattr(a, n) != self.off[n]]
        return " and ".join(f"{n}={getattr(a, n)!r}" for n in names)


_VLLM_COLOCATE = Gate(("use_vllm", "vllm_mode"), lambda a: a.use_vllm and a.vllm_mode == "colocate")
_VLLM_SERVER = Gate(("use_vllm", "vllm_mode"), lambda a: a.use_vllm and a.vllm_mode == "server")
_VLLM_IS = Gate(
    ("use_vllm", "vllm_importance_sampling_correction"),
    lambda a: a.use_vllm and a.vllm_importance_sampling_correction,
)
_VESPO = Gate(("loss_type",), lambda a: a.loss_type == "vespo")
_REF_SYNC = Gate(("sync_ref_model",), lambda a: a.sync_ref_model)
_ADAPTIVE = Gate(("use_adaptive_entropy",), lambda a: a.use_adaptive_entropy)
_EVAL = Gate(
    ("eval_strategy", "eval_on_start"),
    lambda a: a.eval_strategy != "no" or a.eval_on_start,
    off={"eval_strategy": "no", "eval_on_start": False},
)
_EVAL_STEPS = Gate(("eval_strategy",), lambda a: a.eval_strategy == "steps")
_PROCESSES = Gate(("world_size",), lambda a: a.world_size > 1)
_PUSH = Gate(("push_to_hub",), lambda a: a.push_to_hub)

# A field TRL (or transformers) reads only while another argument turns its feature on: its CHECKS rule runs when
# the gate is on, at the point the config is complete (GRPOConfig.__post_init__, an assignment after it, and
# the mapping); with the gate off the value is inert, in TRL and in grpokit (the mapping sets no field from it).
GATES: dict[str, Gate] = {
    "vllm_tensor_parallel_size": _VLLM_COLOCATE,
    "vllm_max_model_length": _VLLM_COLOCATE,
    "vllm_group_port": _VLLM_SERVER,
    "vllm_importance_sampling_cap": _VLLM_IS,
    "vespo_k_pos": _VESPO,
    "vespo_lambda_pos": _VESPO,
    "vespo_k_neg": _VESPO,
    "vespo_lambda_neg": _VESPO,
    "ref_model_mixup_alpha": _REF_SYNC,
    "ref_model_sync_steps": _REF_SYNC,
    "entropy_coef_min": _ADAPTIVE,
    "entropy_coef_max": _ADAPTIVE,
    "entropy_coef_delta": _ADAPTIVE,
    "entropy_target": _ADAPTIVE,
    "eval_steps": _EVAL_STEPS,
    "per_device_eval_batch_size": _EVAL,
    "num_generations_eval": _EVAL,
    "ddp_timeout": _PROCESSES,
    "hub_strategy": _PUSH,
}


def check_gated(a: Any, names: Any = None, *, read: bool = False, value: Any = ...) -> None:
    """Refuse a gated field's value (``names``: these only, else every gated field) where its gate is on in
    ``a``, or where ``read``: the caller reads it now (``evaluate()`` reads the evaluation fields whatever
    eval_strategy says). ``value``: the value about to be set (one name), instead of the current one."""
    for name in GATES if names is None else names:
        gate, rule = GATES[name], CHECKS[name]
        x = getattr(a, name) if value is ... else value
        if isinstance(x, str):
            x = _as_number(x)
        if (read or gate.on(a)) and not rule[0](x):
            because = "read by this call" if read else f"read because {gate.words(a)}"
            raise ConfigError(f"GRPOConfig argument {name}={x!r} is not valid; use {rule[1]} ({because})")


_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {  # a field's annotation -> its check and the words for it
    "bool": (lambda x: isinstance(x, bool), "True or False"),
    "bool | None": (lambda x: x is None or isinstance(x, bool), "None, True or False"),
    "str": (lambda x: isinstance(x, (str, os.PathLike)), "a string"),
    "str | None": (lambda x: x is None or isinstance(x, (str, os.PathLike)), "None or a string"),
}


def check(name: str, value: Any, annotation: str = "") -> None:
    """Refuse ``value`` for GRPOConfig argument ``name`` (declared as ``annotation``) when no run can
    use it: a value of the wrong type (``fp16="yes"``, ``output_dir=123``) or out of range."""
    kind = _TYPES.get(annotation)
    if kind is not None and not kind[0](value):
        raise ConfigError(f"GRPOConfig argument {name}={value!r} is not valid; use {kind[1]}")
    rule = None if name in GATES else CHECKS.get(name)  # a gated field: check_gated, once the config is complete
    if isinstance(value, str):  # a YAML / command-line override ("1e-4"): checked as the number it reads as
        value = _as_number(value)
    if rule is not None and not rule[0](value):
        raise ConfigError(f"GRPOConfig argument {name}={value!r} is not valid; use {rule[1]}")


def _as_number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def kind_of(hint: Any) -> str:
    """ "bool", "bool | None", "str" or "str | None" for ``check``'s type checks; "" for any other type."""
    args = set(typing.get_args(hint))
    for base in (bool, str):
        if hint is base:
            return base.__name__
        if args == {base, type(None)}:
            return f"{base.__name__} | None"
    return ""
