"""Naming reward functions: the `RewardSpec` record, the built-in registry and `resolve_reward`.

A reward function follows TRL's contract, so existing functions work unchanged:

    fn(prompts, completions, **kwargs) -> list[float | None]      # one entry per completion

(any iterable of them, as TRL takes it: a generator, a 1-D numpy array or torch tensor; ``as_values``; a return
that is not one value per completion is a broken contract that stops the run, rewards/runner.py).

The runner passes as keywords `prompts`, `completions`, `completion_ids` (token ids per completion),
`group_size` (G), `trainer_state` (the run's progress: `global_step`, `max_steps`, `epoch`; None outside
a run), `log_metric(name, value)` (a scalar averaged into the step's metrics, as TRL's), `log_extra(column,
values)` (per-completion values kept with the step's samples, as TRL's) and every extra dataset column,
one entry per completion. A function that does not declare a keyword (and has no `**kwargs`) simply
does not receive it. `None` means "not applicable to this completion" and is left out of the weighted sum.

Under TRL's convention (reward.convention=trl, always under grpokit.trl) a function gets exactly the
keywords TRL's ``_calculate_rewards`` passes: no `group_size` (TRL has none; only grpokit's own functions
marked ``reads_group_size`` still get it), and no column named `prompt`, `completion` or `completion_ids`
(TRL leaves those keys of its rows out; ``passed_columns``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from .calls import collecting_faults
from .errors import RewardError, RewardInfrastructureError
from .pool_worker import run_task

RewardFn = Callable[..., Any]

# The keywords grpokit itself passes reward functions; a dataset column of one of these names would be
# replaced by grpokit's value, so it is refused where rows are read (data/prompts.py check_columns) and
# where the runner merges columns with its own (RewardRunner.score). TRL raises on the same collision.
RUNNER_KEYWORDS = ("prompts", "completions", "completion_ids", "group_size", "trainer_state")  # RewardRunner.score
LOGGING_KEYWORDS = ("log_metric", "log_extra")  # call_reward, in the process that runs the function
EPISODE_KEYWORDS = ("environments",)  # rewards/inputs.py: one environment per episode
RESERVED_KEYWORDS = (*RUNNER_KEYWORDS, *LOGGING_KEYWORDS, *EPISODE_KEYWORDS)
TRL_ROW_KEYS = ("prompt", "completion", "completion_ids")
"""Keys of TRL's ``inputs`` rows that its ``_calculate_rewards`` passes to no reward function as a column."""
CONVENTIONS = ("grpokit", "trl")

__all__ = ["BUILTINS", "RewardError", "RewardInfrastructureError", "RewardSpec", "call_reward", "resolve_reward"]


# Built-in name -> "module:function" (imported lazily so that `import grpokit.rewards` stays light).
BUILTINS: dict[str, str] = {
    "math_accuracy": "grpokit.rewards.math:math_accuracy",
    "strict_format": "grpokit.rewards.format:strict_format",
    "tag_count": "grpokit.rewards.format:tag_count",
    "reasoning_steps": "grpokit.rewards.format:reasoning_steps",
    "cosine_length": "grpokit.rewards.length:cosine_length",
    "repetition_penalty": "grpokit.rewards.length:repetition_penalty",
    "length_penalty": "grpokit.rewards.length:length_penalty",
    "overlong_penalty": "grpokit.rewards.length:overlong_penalty",
    "code_pass_fraction": "grpokit.rewards.code:code_pass_fraction",
    "code_all_pass": "grpokit.rewards.code:code_all_pass",
    "box_iou": "grpokit.rewards.grounding:box_iou_reward",
    "box_format": "grpokit.rewards.grounding:box_format",
    "vqa_accuracy": "grpokit.rewards.grounding:vqa_accuracy",
    "count_accuracy": "grpokit.rewards.grounding:count_reward",
    "choice_accuracy": "grpokit.rewards.grounding:choice_accuracy",
}


def reward_name(fn: Any) -> str:
    """The one name of a reward function, wherever it is named (its metrics ``rewards/<name>/...``, its column
    in samples and TRL's ``_logs``, grpokit.trl's ``reward_func_names``): TRL's rule, a ``functools.partial``
    unwrapped to the function it binds, then that function's ``__name__``, else a callable object's class
    name."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def _import_path(path: str) -> RewardFn:
    """``module:function``; the module is looked for on sys.path and in the working directory (a
    script's own reward module beside it, as TRL's CLI finds it)."""
    module_name, _, attr = path.partition(":")
    cwd = os.getcwd()
    try:
        if cwd not in sys.path and importlib.util.find_spec(module_name.split(".")[0]) is None:
            sys.path.append(cwd)
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardError(
            f"Reward '{path}': module '{module_name}' could not be imported from the working directory "
            f"{cwd} or sys.path ({exc})."
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"Reward '{path}': module '{module_name}' has no callable named '{attr}'.")
    return fn


def resolve_reward(name: str, **params: Any) -> RewardFn:
    """Turn a built-in name or a "package.module:function" path into a callable.

    Keyword `params` are bound with `functools.partial` (which stays picklable for worker processes),
    e.g. `resolve_reward("overlong_penalty", max_length=1024, cache_length=256)`.
    """
    if ":" in name:
        fn = _import_path(name)
    elif name in BUILTINS:
        fn = _import_path(BUILTINS[name])
    else:
        valid = ", ".join(sorted(BUILTINS))
        raise RewardError(
            f"Unknown reward '{name}': use a built-in name ({valid}) or an import path 'package.module:function'."
        )
    return functools.partial(fn, **params) if params else fn


def reads_group_size(fn: RewardFn) -> RewardFn:
    """Marks one of grpokit's own reward functions as reading ``group_size`` (G: a group-relative reward,
    Kimi's length penalty), so that it gets the keyword under TRL's convention too."""
    fn.reads_group_size = True  # type: ignore[attr-defined]
    return fn


def passes_group_size(fn: RewardFn, convention: str) -> bool:
    """Whether ``fn`` gets the ``group_size`` keyword: always under grpokit's convention; under TRL's, which
    passes no such keyword, only when it is marked ``reads_group_size`` (a ``functools.partial`` of one too).
    Example: a user's ``f(completions, **kw)`` under "trl" gets no group_size; ``length_penalty`` gets G."""
    if convention != "trl":
        return True
    while isinstance(fn, functools.partial):
        fn = fn.func
    return bool(getattr(fn, "reads_group_size", False))


def passed_columns(columns: dict[str, list], convention: str) -> dict[str, list]:
    """The columns passed as keywords: all of them under grpokit's convention; under TRL's all but
    ``TRL_ROW_KEYS`` (TRL's ``_calculate_rewards`` takes the keys of its rows but those three).
    Example: {"prompt": [...], "completion": [...], "level": [1]} under "trl" -> {"level": [1]}."""
    if convention != "trl":
        return columns
    return {k: v for k, v in columns.items() if k not in TRL_ROW_KEYS}


def _accepted_keywords(fn: RewardFn) -> set[str] | None:
    """Names `fn` accepts as keywords, or None when it takes **kwargs (accepts everything)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


class LoggedValues(list):
    """A reward function's values plus what it logged through ``log_metric`` / ``log_extra``
    (``metrics``: name -> values, ``extra``: column -> values). A list, so it pickles back from a
    worker process with its logs."""

    def __init__(self, values=(), metrics: dict | None = None, extra: dict | None = None):
        super().__init__(values)
        self.metrics: dict[str, list[float]] = metrics or {}
        self.extra: dict[str, list[Any]] = extra or {}
        self.faults: dict[int, tuple[str, str]] = {}  # completion -> (kind, reason), see rewards/calls.py
        self.broken = ""
        """What the function returned instead of one value per completion ("returned 2 values for 4
        completions"): a broken contract, which the runner stops the run with, never retries (no values then)."""


def as_values(values: Any, n: int | None) -> list:
    """A function's return as a list of ``n`` values (None: any count), as TRL takes it: any iterable of
    numbers (a list, a tuple, a generator, a 1-D numpy array or torch tensor). What is not one value per
    completion raises ``TypeError`` naming what was returned: a text, a mapping or a set (no order of
    completions), an array of another shape, a wrong count."""
    if hasattr(values, "tolist") and hasattr(values, "shape"):  # numpy array, torch tensor
        shape = tuple(values.shape)
        if len(shape) != 1:
            raise TypeError(f"returned an array of shape {shape}; return one value per completion (a 1-D array)")
        values = values.tolist()
    elif isinstance(values, (str, bytes, dict, set, frozenset)) or not hasattr(values, "__iter__"):
        what = "None" if values is None else f"a {type(values).__name__}"
        raise TypeError(f"returned {what}, not a list of one value per completion")
    values = list(values)
    if n is not None and len(values) != n:
        raise TypeError(f"returned {len(values)} values for {n} completions")
    return values


def call_reward(fn: RewardFn, kwargs: dict[str, Any]) -> LoggedValues:
    """Call one reward function with the keywords it accepts; check it returned one value per completion
    (``as_values``), else record what it returned in ``broken``.

    ``log_metric`` and ``log_extra`` are made here, in the process that runs the function (a worker
    or the trainer), and what they collect travels back with the values, as do the faults the function
    reported for its completions (``grpokit.rewards.calls.report_fault``)."""
    out = LoggedValues()
    n = len(kwargs["completions"]) if "completions" in kwargs else None
    kwargs = {
        **kwargs,
        "log_metric": lambda name, value: out.metrics.setdefault(str(name), []).append(float(value)),
        "log_extra": lambda column, values: out.extra.setdefault(str(column), []).extend(list(values)),
    }
    accepted = _accepted_keywords(fn)
    if accepted is not None:
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    with collecting_faults() as faults:
        values = run_task(fn, (), kwargs)
    out.faults = faults
    out.broken = getattr(values, "broken", "")  # a wrapped function's (data/domains.py) says what it returned
    try:
        out.extend([] if out.broken else as_values(values, n))
    except TypeError as exc:
        out.broken = str(exc)
    return out


@dataclass
class RewardSpec:
    """One weighted reward function.

    fn: the callable; None means "resolve `name` with `resolve_reward`".
    name: metric name (`rewards/{name}/mean` ...); also the built-in or import path when `fn` is None.
    weight: multiplier in the weighted sum of rewards.
    params: keyword arguments bound to the function when it is resolved from `name`.
    """

    fn: RewardFn | None = None
    name: str = ""
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fn is None:
            if not self.name:
                raise RewardError("A RewardSpec needs a callable `fn` or a `name` to resolve.")
            self.fn = resolve_reward(self.name, **self.params)
        elif not callable(self.fn):
            raise RewardError(f"RewardSpec '{self.name}': fn must be callable, got {type(self.fn).__name__}.")
        if not self.name:
            self.name = reward_name(self.fn)
        self.weight = float(self.weight)
