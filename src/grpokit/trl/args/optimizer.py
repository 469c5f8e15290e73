"""TRL's optimizer and schedule arguments -> grpokit's optim section (optim/optimizers.py, optim/schedule.py):
learning_rate, weight_decay, the Adam settings, max_grad_norm, optim and optim_args, lr_scheduler_type,
lr_scheduler_kwargs and warmup_steps.

Each value means what transformers 5's Trainer makes of it: ``lr_scheduler_type`` and ``lr_scheduler_kwargs``
as ``transformers.get_scheduler`` reads them over ``max_steps`` updates, ``optim`` and ``optim_args`` as
``Trainer.get_optimizer_cls_and_kwargs`` (tests/trl/test_trl_optim.py checks both against transformers itself).
Each argument's mapping rule, its arithmetic and its single-value check live here together.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

from grpokit.config.base import ConfigError
from grpokit.config.optim import OPTIMIZER_FIELDS
from grpokit.optim.optimizers import PACKAGES, missing_package

from .batch import trl_max_steps
from .predicates import above, at_least, is_number, within
from .rule import Rule, TrlArgs, refuse

# lr_scheduler_type -> (optim.schedule, {lr_scheduler_kwargs key: optim field})
SCHEDULE_ARGS: dict[str, tuple[str, dict[str, str]]] = {
    "linear": ("linear", {}),
    "constant": ("constant", {}),
    "constant_with_warmup": ("constant", {}),
    "cosine": ("cosine", {"num_cycles": "num_cycles"}),
    "cosine_with_min_lr": (
        "cosine_with_min_lr",
        {"num_cycles": "num_cycles", "min_lr_rate": "min_lr_rate", "min_lr": "min_lr_rate"},
    ),
    "cosine_warmup_with_min_lr": (
        "cosine_warmup_with_min_lr",
        {
            "num_cycles": "num_cycles",
            "min_lr_rate": "min_lr_rate",
            "min_lr": "min_lr_rate",
            "warmup_lr_rate": "warmup_lr_rate",
        },
    ),
    "cosine_with_restarts": ("cosine_with_restarts", {"num_cycles": "restart_cycles"}),
    "polynomial": ("polynomial", {"power": "power", "lr_end": "lr_end"}),
    "inverse_sqrt": ("inverse_sqrt", {"timescale": "timescale"}),
    "warmup_stable_decay": (
        "warmup_stable_decay",
        {
            "num_decay_steps": "num_decay_steps",
            "num_stable_steps": "num_stable_steps",
            "min_lr_ratio": "min_lr_rate",
            "warmup_type": "warmup_type",
            "decay_type": "decay_type",
            "num_cycles": "num_cycles",
        },
    ),
}


_TAKES_NO_KWARGS = (
    "constant",
    "constant_with_warmup",
)  # get_scheduler passes them no lr_scheduler_kwargs: any key changes nothing


REFUSED_SCHEDULES = {  # transformers schedules that cannot mean anything on grpokit's step-indexed schedule
    "reduce_lr_on_plateau": "it lowers the rate from an evaluation metric "
    "(metric_for_best_model after each evaluate()), "
    "where grpokit's rate is a function of the update count",
    "greedy": "it moves the rate up and down from an evaluation metric after each evaluate(), where grpokit's "
    "rate is a "
    "function of the update count",
}


def scheduler_kwargs(a: TrlArgs) -> dict[str, Any]:
    """lr_scheduler_kwargs as transformers reads it: None is {}, a JSON string (a command line's) is parsed,
    its "true"/"3"/"0.5" strings read as bool, int and float; a key set to None is left out (the
    schedule's default, which is None for every optional key transformers' schedules take)."""
    kw = a.lr_scheduler_kwargs
    try:
        kw = json.loads(kw) if isinstance(kw, str) and kw.startswith("{") else kw
    except json.JSONDecodeError:
        kw = "not JSON"
    if kw is None or kw == "":
        return {}
    if not isinstance(kw, dict):
        raise refuse("lr_scheduler_kwargs", a.lr_scheduler_kwargs, "None, a dict or a JSON object string")
    return {k: _typed(v) for k, v in kw.items() if v is not None}


def _typed(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    return int(v) if v.isdigit() else float(v) if v.replace(".", "", 1).isdigit() else v


def schedule_fields(a: TrlArgs, max_steps: int) -> dict[str, Any]:
    """optim.schedule, its options, the warm-up and the length (max_steps TRL steps, transformers'
    num_training_steps)."""
    kind = a.lr_scheduler_type
    if kind in REFUSED_SCHEDULES:
        raise ConfigError(
            f"GRPOConfig argument lr_scheduler_type={kind!r} is not supported by grpokit: {REFUSED_SCHEDULES[kind]}"
        )
    if kind not in SCHEDULE_ARGS:
        raise refuse("lr_scheduler_type", kind, ", ".join(SCHEDULE_ARGS))
    schedule, keys = SCHEDULE_ARGS[kind]
    kw = scheduler_kwargs(a)
    if kind not in _TAKES_NO_KWARGS and set(kw) - set(keys):  # transformers: a TypeError (unexpected keyword argument)
        raise refuse(
            "lr_scheduler_kwargs",
            a.lr_scheduler_kwargs,
            f"with {kind} " + (f"the keys {', '.join(keys)}" if keys else "None or {}"),
        )
    out = {f"optim.{keys[k]}": v for k, v in kw.items() if k in keys}
    out.update(_schedule_specifics(kind, kw, a.learning_rate))
    warm = int(a.warmup_steps) if a.warmup_steps >= 1 else math.ceil(max_steps * a.warmup_steps)  # get_warmup_steps
    return {
        **out,
        "optim.schedule": schedule,
        "optim.schedule_steps": max_steps,
        "optim.warmup_steps": 0 if kind == "constant" else warm,
    }  # transformers' constant has no warm-up


def _schedule_specifics(kind: str, kw: dict[str, Any], lr: float) -> dict[str, Any]:
    """What transformers' schedule functions require or convert: one of min_lr / min_lr_rate (min_lr is
    divided by the learning rate) and num_decay_steps of warmup_stable_decay."""
    out: dict[str, Any] = {}
    if kind in ("cosine_with_min_lr", "cosine_warmup_with_min_lr"):
        if ("min_lr" in kw) == ("min_lr_rate" in kw):  # None-valued keys are gone already
            raise refuse(
                "lr_scheduler_kwargs", kw, f"with {kind} exactly one of min_lr and min_lr_rate (as transformers)"
            )
        out["optim.min_lr_rate"] = kw["min_lr"] / lr if "min_lr" in kw else kw["min_lr_rate"]
    if kind == "warmup_stable_decay" and "num_decay_steps" not in kw:
        raise refuse(
            "lr_scheduler_kwargs", kw, "with warmup_stable_decay a dict with num_decay_steps (transformers requires it)"
        )
    return out


_BNB_MORE = (  # bitsandbytes' other optimizers, built as transformers builds them with no optim_args
    "paged_adamw_32bit",
    "ademamix",
    "ademamix_8bit",
    "paged_ademamix_32bit",
    "paged_ademamix_8bit",
    "lion_32bit",
    "lion_8bit",
    "paged_lion_32bit",
    "paged_lion_8bit",
    "rmsprop_bnb",
    "rmsprop_bnb_8bit",
    "rmsprop_bnb_32bit",
)


# optim -> (optim.optimizer, {optim_args key: optim field}); keys transformers reads but that change nothing
# (the Trainer's parameter groups carry weight_decay, which wins over the optimizer's) map to None
OPTIM_ARGS: dict[str, tuple[str, dict[str, str | None]]] = {
    "adamw_torch": ("adamw", {}),
    "adamw_torch_fused": ("adamw", {}),
    "adafactor": ("adafactor", {}),
    "sgd": ("sgd", {"momentum": "momentum", "dampening": "dampening", "nesterov": "nesterov", "weight_decay": None}),
    "adagrad": ("adagrad", {"lr_decay": "lr_decay", "eps": "eps", "weight_decay": None}),
    "rmsprop": (
        "rmsprop",
        {"momentum": "momentum", "alpha": "rms_alpha", "eps": "eps", "centered": "centered", "weight_decay": None},
    ),
    "adamw_8bit": ("adamw_8bit", {}),
    "adamw_bnb_8bit": ("adamw_8bit", {}),
    "paged_adamw_8bit": ("paged_adamw_8bit", {}),
    **{n: (n, {}) for n in _BNB_MORE},
    "adamw_torch_4bit": ("adamw_torch_4bit", {}),
    "adamw_torch_8bit": ("adamw_torch_8bit", {}),
}


def parse_optim_args(text: str | None) -> dict[str, str]:
    """transformers' reading of optim_args: "key=value,key=value", spaces removed."""
    if not text:
        return {}
    out = {}
    for pair in text.replace(" ", "").split(","):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise refuse("optim_args", text, "comma-separated key=value pairs, e.g. 'momentum=0.9,nesterov=True'")
        out[key] = value
    return out


def optimizer_fields(a: TrlArgs) -> dict[str, Any]:
    """optim.optimizer and what optim_args sets, read as transformers does (numbers as float, flags true/1/yes)."""
    if a.optim not in OPTIM_ARGS:
        raise refuse(
            "optim",
            a.optim,
            ", ".join(OPTIM_ARGS) + " (the others need packages or devices grpokit does not "
            "build on: GaLore, APOLLO, LOMO, schedule-free, XLA, NPU ...)",
        )
    name, keys = OPTIM_ARGS[a.optim]
    if missing_package(name) is not None:
        raise ConfigError(
            f"GRPOConfig argument optim={a.optim!r} needs the {PACKAGES[name]} package, which is not installed; "
            f"install it (a CUDA library) or use adamw_torch"
        )
    args = parse_optim_args(a.optim_args)
    if a.optim in _TORCHAO and not _torchao_default(args):
        raise refuse(
            "optim_args",
            a.optim_args,
            f"with optim={a.optim!r} only block_size=256 and bf16_stochastic_round=False "
            "(grpokit builds torchao's optimizer with those)",
        )
    if a.optim in _BNB_MORE and args:  # transformers passes AdEMAMix's and RMSprop's optim_args on to bitsandbytes
        raise refuse("optim_args", a.optim_args, f"None with optim={a.optim!r} (grpokit builds it with its defaults)")
    if not keys:
        return {"optim.optimizer": name}  # transformers reads no optim_args for these optimizers
    if set(args) - set(keys):
        raise refuse("optim_args", a.optim_args, f"with optim={a.optim!r} the keys {', '.join(keys)}")
    out: dict[str, Any] = {"optim.optimizer": name}
    for key, value in args.items():
        if keys[key] is not None:
            out[f"optim.{keys[key]}"] = _flag(value) if key in ("nesterov", "centered") else _number(key, value)
    return out


def _flag(value: str) -> bool:
    return value.lower() in ("true", "1", "yes")


def _number(key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise refuse("optim_args", f"{key}={value}", f"a number for {key}") from None


_TORCHAO = ("adamw_torch_4bit", "adamw_torch_8bit")


def _torchao_default(args: dict[str, str]) -> bool:
    """torchao's optim_args at the values grpokit builds with (block_size 256, no stochastic rounding)."""
    return args.get("block_size", "256") == "256" and not _flag(args.get("bf16_stochastic_round", "False"))


LEARNING_RATE = Rule(
    ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm"),
    (
        "optim.lr",
        "optim.weight_decay",
        "optim.adam_beta1",
        "optim.adam_beta2",
        "optim.adam_eps",
        "optim.max_grad_norm",
        "optim.decay_norms_and_biases",
    ),
    "copied; the Adam settings only where the optimizer reads them (transformers passes them to the Adam family "
    "alone); max_grad_norm <= 0: no clipping (0), as transformers; weight_decay reaches the parameters "
    "transformers' Trainer decays, not biases and norm weights (decay_norms_and_biases false, with a decay)",
    lambda a, ctx: {
        "optim.lr": a.learning_rate,
        "optim.weight_decay": a.weight_decay,
        **adam_fields(a),
        "optim.max_grad_norm": max(a.max_grad_norm, 0.0),
        # transformers' two parameter groups (optim/decay.py), which only say where a weight decay reaches
        **({"optim.decay_norms_and_biases": False} if a.weight_decay else {}),
    },
)


def adam_fields(a: TrlArgs) -> dict[str, float]:
    """adam_beta1, adam_beta2, adam_epsilon as the optim fields the optimizer of ``optim`` reads (transformers
    gives them to the Adam family only, so with sgd, adafactor ... they change nothing there, nor here: grpokit's
    own check refuses an optim.adam_* set where nothing reads it)."""
    given = {"optim.adam_beta1": a.adam_beta1, "optim.adam_beta2": a.adam_beta2, "optim.adam_eps": a.adam_epsilon}
    reads = OPTIMIZER_FIELDS.get(OPTIM_ARGS.get(a.optim, ("adamw", {}))[0], ())
    return {k: v for k, v in given.items() if k.removeprefix("optim.") in reads}


SCHEDULE = Rule(
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
    "transformers' schedule of that name over max_steps updates (schedule_steps); "
    "constant_with_warmup is grpokit's "
    "constant, transformers' constant has no warm-up; a fractional warmup_steps is a share of max_steps; "
    "lr_scheduler_kwargs keys set the fields of the same name, except cosine_with_restarts' "
    "num_cycles: restart_cycles, "
    "min_lr: min_lr_rate = min_lr / learning_rate, min_lr_ratio: min_lr_rate (constant and constant_with_warmup "
    "ignore them, as transformers); reduce_lr_on_plateau and greedy are refused (they follow an evaluation metric)",
    lambda a, ctx: schedule_fields(a, trl_max_steps(a, ctx)),
)

OPTIMIZER = Rule(
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
    "(Adafactor on the learning rate and schedule, no relative step or parameter scaling); "
    "adamw_8bit (adamw_bnb_8bit), "
    "paged_adamw_8bit and bitsandbytes' others (paged_adamw_32bit, ademamix(_8bit), paged_ademamix_32bit/_8bit, "
    "lion_32bit/_8bit, paged_lion_32bit/_8bit, rmsprop_bnb(_8bit/_32bit): transformers' classes and defaults, no "
    "optim_args), adamw_torch_4bit and adamw_torch_8bit (torchao) when that "
    "package is installed; "
    "optim_args read as transformers: sgd momentum, dampening, nesterov; adagrad lr_decay, eps; rmsprop momentum, "
    "alpha (rms_alpha), eps, centered; their weight_decay key changes nothing, as in transformers (the parameter "
    "groups' weight_decay wins); the other optimizers read no optim_args, as transformers",
    lambda a, ctx: optimizer_fields(a),
)


CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {  # single-value checks (checks.py runs them)
    "learning_rate": (
        above(0),
        "a finite number > 0 (TRL runs 0 too, and trains nothing: every update is lr * something = 0)",
    ),
    "weight_decay": (at_least(0), "a finite number >= 0 (TRL runs a negative one too, growing every weight)"),
    "adam_beta1": (within(0, 1), "a number in [0, 1]"),
    "adam_beta2": (within(0, 1), "a number in [0, 1]"),
    "adam_epsilon": (at_least(0), "a finite number >= 0"),
    "max_grad_norm": (is_number, "a finite number (<= 0: no clipping, as transformers)"),
    "warmup_steps": (at_least(0), "a finite number >= 0"),
}
