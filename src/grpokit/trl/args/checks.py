"""Single-value checks of TRL's GRPOConfig arguments, run when an argument is set.

A value no run can use (``learning_rate=inf``, ``num_generations=0``, ``reward_weights=[nan]``) is
refused with one sentence naming the argument, the value and what is valid, instead of a silent
acceptance or a Python error deep in training. Each group module (loss.py, sampling.py, batch.py ...)
holds its fields' ``CHECKS`` beside their mapping rules; this module joins them and runs them. Checks
that involve two arguments stay in the mapping's rules, where the values are combined; a field TRL reads
only while another argument is on (``GATES``: vllm_* with use_vllm, vespo_* with loss_type vespo ...) is
checked only then, as TRL ignores it otherwise.
"""

from __future__ import annotations

import os
import typing
from typing import Any, Callable

from grpokit.config.sections import ConfigError

from . import batch, checkpoints, loss, model, optimizer, reporting, run, sampling
from .predicates import Gate

CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **loss.CHECKS,
    **sampling.CHECKS,
    **batch.CHECKS,
    **optimizer.CHECKS,
    **checkpoints.CHECKS,
    **reporting.CHECKS,
    **model.CHECKS,
    **run.CHECKS,
}


# Why grpokit refuses a field's other values where TRL runs them: the sentence says what TRL does there
REFUSED_WHY = {
    "bf16_full_eval": "TRL runs True: transformers casts the whole model to bfloat16 in place at an evaluate() "
    "outside train(), and a later train() goes on from the cast weights; grpokit evaluates in the training dtype",
    "fp16_full_eval": "TRL runs True: transformers casts the whole model to float16 in place at an evaluate() "
    "outside train(), and a later train() goes on from the cast weights; grpokit evaluates in the training dtype",
}


# A field TRL (or transformers) reads only while another argument turns its feature on: its CHECKS rule runs when
# the gate is on, at the point the config is complete (GRPOConfig.__post_init__, an assignment after it, and
# the mapping); with the gate off the value is inert, in TRL and in grpokit (the mapping sets no field from it).
# check_gated reports the first gated field that fails, in this order.
GATES: dict[str, Gate] = {**sampling.GATES, **loss.GATES, **run.GATES, **checkpoints.GATES}


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
