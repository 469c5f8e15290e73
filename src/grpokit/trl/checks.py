"""Single-value checks of TRL's GRPOConfig arguments, run when an argument is set.

A value no run can use (``learning_rate=inf``, ``num_generations=0``, ``reward_weights=[nan]``) is
refused with one sentence naming the argument, the value and what is valid, instead of a silent
acceptance or a Python error deep in training. Checks that involve two arguments stay in
the mapping's rules (mapping.py, *_rules.py), where the values are combined.
"""

from __future__ import annotations

import math
import os
import typing
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
    "learning_rate": (_above(0), "a finite number > 0"),
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
    "num_generations_eval": (_at_least(1, integer=True, none=True), "None or an integer >= 1"),
    "num_iterations": (_at_least(1, integer=True), "an integer >= 1"),
    "max_completion_length": (_at_least(1, integer=True), "an integer >= 1"),
    "temperature": (_above(0), "a finite number > 0"),
    "top_p": (lambda x: _num(x) and 0 < x, "a number > 0 (above 1: off, as 1 and transformers)"),
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
    "top_entropy_quantile": (lambda x: _num(x) and 0 < x <= 1, "a number in (0, 1]"),
    "entropy_coef": (_at_least(0), "a finite number >= 0"),
    "entropy_coef_min": (_at_least(0), "a finite number >= 0"),
    "neftune_noise_alpha": (_at_least(0, none=True), "None or a finite number >= 0"),
    "router_aux_loss_coef": (_at_least(0, none=True), "None (the model's own) or a finite number >= 0"),
    "entropy_coef_max": (_at_least(0), "a finite number >= 0"),
    "entropy_coef_delta": (_at_least(0), "a finite number >= 0"),
    "entropy_target": (_at_least(0), "a finite number >= 0 (nats)"),
    "off_policy_mask_threshold": (_at_least(0, none=True), "None or a finite number >= 0"),
    "logging_steps": (  # transformers: below 1 is ceil(steps * value), a negative period read as its size
        lambda x: _num(x) and x != 0,
        "a number other than 0 (below 1: a fraction of the steps)",
    ),
    "save_steps": (_above(0), "a number > 0 (below 1: a fraction of the steps)"),
    "eval_steps": (_above(0, none=True), "None or a number > 0"),
    "save_total_limit": (
        lambda x: x is None or _int(x),
        "None or an integer (None or <= 0: keep every checkpoint, as transformers)",
    ),
    "ref_model_sync_steps": (_at_least(1, integer=True), "an integer >= 1"),
    "seed": (_int, "an integer"),
    "data_seed": (lambda x: x is None or _int(x), "None or an integer"),
    "eval_delay": (_at_least(0), "a finite number >= 0"),
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
    # named choices, checked when set (TRL reads some only with another argument, e.g. vllm_mode with use_vllm)
    "vllm_mode": (lambda x: x in ("colocate", "server"), "'colocate' or 'server'"),
    "importance_sampling_level": (lambda x: x in ("token", "sequence"), "'token' or 'sequence'"),
    "vllm_importance_sampling_mode": (lambda x: x in TIS_MODES, "one of " + ", ".join(TIS_MODES)),
}


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
    rule = CHECKS.get(name)
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
