"""TRL's run arguments -> grpokit's train fields: seeds and data order (seed, full_determinism,
shuffle_dataset, data_seed), the processes (ddp_timeout, fsdp, fsdp_config), the evaluation schedule
(eval_strategy, eval_steps, and the checks of the evaluation and best-model arguments GRPOTrainer carries
out: by_trainer.py, best.py) and torch_empty_cache_steps' check.

Each argument's mapping rule and its single-value check live here together.
"""

from __future__ import annotations

from typing import Any, Callable

from .predicates import Gate, above, at_least, is_int, is_number
from .rule import Rule, TrlArgs, refuse

_FSDP_DEFAULTS = {
    ("fsdp_version", 2),
    ("version", 2),
    ("reshard_after_forward", True),
    ("min_num_params", 0),
    ("xla", False),
    ("xla_fsdp_v2", False),
    ("xla_fsdp_grad_ckpt", False),
}


def _fsdp(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    opts = (
        a.fsdp.split()
        if isinstance(a.fsdp, str)
        else ([] if a.fsdp in (None, False) else ["full_shard"] if a.fsdp is True else list(a.fsdp))
    )
    if opts and (opts[0] != "full_shard" or set(opts[1:]) - {"auto_wrap"}):
        raise refuse(
            "fsdp", a.fsdp, "None, True, 'full_shard' or 'full_shard auto_wrap' (grpokit's FSDP2 shards fully)"
        )
    cfg = {k: v for k, v in (a.fsdp_config or {}).items() if (k, v) not in _FSDP_DEFAULTS}
    if cfg:
        raise refuse("fsdp_config", a.fsdp_config, "None, {} or {'fsdp_version': 2}")
    return {"train.fsdp": bool(opts)}


def _eval(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    if a.eval_strategy not in ("no", "steps", "epoch"):
        raise refuse("eval_strategy", a.eval_strategy, "no, steps, epoch")
    return {
        "train.eval_every": 0
    }  # GRPOTrainer.evaluate() runs at TRL's eval steps or epoch ends (grpokit/trl/bridge.py)


_EVAL = Gate(
    ("eval_strategy", "eval_on_start"),
    lambda a: a.eval_strategy != "no" or a.eval_on_start,
    off={"eval_strategy": "no", "eval_on_start": False},
)
_EVAL_STEPS = Gate(("eval_strategy",), lambda a: a.eval_strategy == "steps")
_PROCESSES = Gate(("world_size",), lambda a: a.world_size > 1)

CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {  # single-value checks (checks.py runs them)
    "seed": (is_int, "an integer"),
    "data_seed": (lambda x: x is None or is_int(x), "None or an integer"),
    "eval_steps": (  # transformers replaces None and 0 by logging_steps; a negative one is a period as logging_steps'
        lambda x: x is None or (is_number(x) and x != 0),
        "None or a number other than 0 (below 1: a fraction of the steps)",
    ),
    "per_device_eval_batch_size": (at_least(1, integer=True), "an integer >= 1"),
    "num_generations_eval": (
        lambda x: x is None or (is_int(x) and x >= 0),
        "None or an integer >= 0 (None or 0: num_generations, as TRL)",
    ),
    "eval_delay": (is_number, "a finite number (<= 0: no delay, as transformers)"),
    "metric_for_best_model": (
        lambda x: x is None or (isinstance(x, str) and x.strip() != ""),
        "None or a metric name such as 'loss' or 'eval_reward'",
    ),
    "ddp_timeout": (above(0), "a number of seconds > 0"),
    "torch_empty_cache_steps": (at_least(1, integer=True, none=True), "None or an integer >= 1"),
}

GATES: dict[str, Gate] = {  # fields TRL reads only while another argument is on (checks.py)
    "eval_steps": _EVAL_STEPS,
    "per_device_eval_batch_size": _EVAL,
    "num_generations_eval": _EVAL,
    "ddp_timeout": _PROCESSES,
}

SEEDS = Rule(
    ("seed", "full_determinism", "shuffle_dataset"),
    ("train.seed", "train.deterministic", "data.shuffle"),
    "copied; shuffle_dataset None: no shuffle, as TRL",
    lambda a, ctx: {
        "train.seed": a.seed,
        "train.deterministic": a.full_determinism,
        "data.shuffle": bool(a.shuffle_dataset),  # None: no shuffle, as TRL's sampler (it tests the value)
    },
)


def _ddp_timeout(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    """train.dist_timeout_s only where grpokit joins the process group: under torchrun transformers' own
    TrainingArguments (the GRPOConfig) joins it when built, with ddp_timeout as under TRL (with use_cpu=True
    transformers passes none: torch's default, as under TRL), so the group is joined before grpokit's setup,
    which would only warn that its timeout changes nothing (before: on every such run, at ddp_timeout's default too).
    Example: 2 processes, a group not joined yet (a CPU-only machine without use_cpu) -> ddp_timeout; joined -> {}."""
    if not GATES["ddp_timeout"].on(a) or ctx.get("joined"):
        return {}
    return {"train.dist_timeout_s": a.ddp_timeout}


DDP_TIMEOUT = Rule(
    ("ddp_timeout",),
    ("train.dist_timeout_s",),
    "the process group's timeout under torchrun, as transformers: the GRPOConfig joins the group with it when it is "
    "built (use_cpu=True: torch's default, as under TRL); copied where grpokit joins the group (none joined yet); "
    "one process: not read, as transformers (checks.GATES: the GRPOConfig's world_size)",
    _ddp_timeout,
)

FSDP = Rule(
    ("fsdp", "fsdp_config"),
    ("train.fsdp",),
    "full_shard (auto_wrap or not) or True: FSDP2 (grpokit wraps each decoder layer); fsdp_config only fsdp_version 2",
    _fsdp,
)

EVALUATION = Rule(
    ("eval_strategy", "eval_steps"),
    ("train.eval_every",),
    "GRPOTrainer.evaluate() every eval_steps TRL steps (None: logging_steps), or with "
    "eval_strategy=epoch at the end of "
    "every epoch and of training (eval_delay counts epochs then, as transformers); grpokit's own "
    "greedy evaluation is off",
    _eval,
)
