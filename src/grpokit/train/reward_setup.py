"""The run's reward functions from its config: named built-ins, import paths, the task's reward,
passed callables and environments' rewards; their parameters checked; the evaluator's verifier and
the process reward.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from grpokit.config.sections import Config, ConfigError
from grpokit.rewards import process_steps
from grpokit.rewards.runner import RewardRunner
from grpokit.rewards.spec import RewardError, RewardSpec, resolve_reward

from .run_data import task_of


def reward_specs(cfg: Config, extra: list[Callable] | None, environment_factory=None) -> list[RewardSpec]:
    """The configured reward functions (built-in names, import paths, "task") plus passed callables,
    plus each environment class's ``get_reward()`` (weight 1, named after its class, as TRL).
    "task" is the built-in task's reward; with one's own data, passed callables take its place."""
    from grpokit.env import environment_rewards

    env_rewards = environment_rewards(environment_factory)
    passed = list(extra or [])
    names, weights = cfg.reward.functions, cfg.reward.weights or [1.0] * len(cfg.reward.functions)
    if len(weights) not in (len(names), len(names) + len(passed)):
        raise ConfigError(
            f"reward.weights has {len(weights)} entries but there are {len(names) + len(passed)} reward functions "
            f"({len(names)} in reward.functions, {len(passed)} passed as callables); give one weight per function "
            "(the named ones first, then the callables in order) or none"
        )
    extra_weights = weights[len(names) :] or [1.0] * len(passed)  # the environment's own reward has weight 1, as TRL
    extra = passed + env_rewards
    extra_weights = list(extra_weights) + [1.0] * (len(extra) - len(passed))
    task = task_of(cfg)
    passed_specs = [
        RewardSpec(fn=f, name=getattr(f, "__name__", f"reward_{i}"), weight=w)
        for i, (f, w) in enumerate(zip(extra, extra_weights))
    ]
    specs = []
    for name, w in zip(names, weights):
        if name == "task" and extra and task is None:
            # without a task the passed functions take "task"'s place, in its place: the run's grader is the
            # first function (grader), so --preset dapo's [task, overlong_penalty] grades with the passed verifier
            specs, passed_specs = specs + passed_specs, []
            continue
        if name == "task":
            if task is None:
                raise ConfigError(
                    "reward.functions names 'task' (the built-in task's reward) but the run trains on its own "
                    "data; name its reward instead (e.g. reward.functions=[math_accuracy]) or pass reward_funcs"
                )
            specs.append(RewardSpec(fn=task.reward_fn, name=getattr(task.reward_fn, "__name__", "task"), weight=w))
        else:
            specs.append(RewardSpec(fn=named_reward(cfg, name), name=name.split(":")[-1], weight=w))
    specs += passed_specs  # no "task" entry: the passed functions after the named ones
    if not specs:
        raise ConfigError("reward.functions is empty and no reward function was passed; name at least one (e.g. task)")
    return specs


OVERLONG_CACHE_FRACTION = 0.2  # DAPO: a 4,096-token punishment cache under its 20,480-token limit


def named_reward(cfg: Config, name: str):
    """Reward function ``name`` of reward.functions (a built-in or an import path, not "task") resolved with its
    parameters (``reward_params``), which are checked."""
    try:
        fn = resolve_reward(name, **reward_params(cfg, name))
    except RewardError as e:
        raise ConfigError(f"reward.functions: {e}{_import_hint(name)}") from None
    check_reward_params(name, fn, cfg.reward.params.get(name, {}))
    return fn


def reward_params(cfg: Config, name: str) -> dict:
    """reward.params of one function, with the parameters derived from the run's settings where it leaves
    them out (``derived_params``)."""
    params = {**cfg.reward.params.get(name, {}), **derived_params(cfg, name)}
    if name == "overlong_penalty":
        _check_window(params, cfg)
    return params


def derived_params(cfg: Config, name: str) -> dict:
    """The parameters of reward function ``name`` that follow the run's settings, those reward.params.<name> does
    not give: overlong_penalty's window (max_length = rollout.max_new_tokens, cache_length = DAPO's fifth of
    max_length); {} for every other function. Read from ``cfg`` as it is when called, so a stage of train.stages
    that changes the generation length has the stage's window (``follow_settings``); a given value stays."""
    if name != "overlong_penalty":
        return {}
    given = cfg.reward.params.get(name, {})
    max_length = given.get("max_length", cfg.rollout.max_new_tokens)
    out = {} if "max_length" in given else {"max_length": max_length}
    if "cache_length" not in given:
        out["cache_length"] = max(1, round(OVERLONG_CACHE_FRACTION * max_length))
    return out


def _check_window(params: dict, cfg: Config) -> None:
    """overlong_penalty's window must fit: 0 < cache_length <= max_length (else every call would fail)."""
    m, c = params["max_length"], params["cache_length"]
    if isinstance(m, int) and isinstance(c, int) and not 0 < c <= m:
        given = cfg.reward.params.get("overlong_penalty", {})
        whence = "" if "max_length" in given else f" (rollout.max_new_tokens={cfg.rollout.max_new_tokens})"
        raise ConfigError(
            f"reward.params.overlong_penalty: cache_length={c} must be > 0 and at most max_length={m}{whence}; "
            "give a cache_length in that range, or a max_length of its own"
        )


def follow_settings(cfg: Config, specs: list[RewardSpec]) -> list[RewardSpec]:
    """``specs`` (as ``reward_specs`` built them from this config) with every named function whose parameters
    follow the run's settings (``derived_params``) resolved again from ``cfg`` as it is now: a stage's
    rollout.max_new_tokens gives that stage's overlong window (train/trainer_stages.py). Every other spec (the
    task's verifier, a passed function, a function without derived parameters) is kept as it is."""
    out = list(specs)
    for i, name in enumerate(spec_sources(cfg, len(specs))):
        if name is not None and derived_params(cfg, name):
            out[i] = replace(out[i], fn=named_reward(cfg, name))
    return out


def spec_sources(cfg: Config, count: int | None = None) -> list[str | None]:
    """What each of the ``count`` specs ``reward_specs`` builds from ``cfg`` came from, in their order (None: the
    named ones alone): the name in reward.functions of a built-in or import path; "task" for the run's own reward,
    the task's verifier or, in a run without a task, the passed functions (and environments' rewards), which
    stand where reward.functions names "task" (after the named ones when it does not); None for passed functions
    beside a task's verifier."""
    names = list(cfg.reward.functions)
    if task_of(cfg) is not None:
        return names if count is None else names[:count] + [None] * (count - len(names))
    named = [n for n in names if n != "task"]
    if count is None:
        return named
    at = len([n for n in names[: names.index("task")] if n != "task"]) if "task" in names else len(named)
    return named[:at] + ["task"] * (count - len(named)) + named[at:]


def judged_columns(names: list[str], specs: list[RewardSpec], sources: list[str | None]) -> list[int] | None:
    """The columns of ``specs`` whose summed values decide which groups dynamic sampling drops
    (algo.dynamic_sampling_on: ``names``, each a spec's name, its reward.functions entry or "task": the specs
    ``sources`` marks "task"); None for no names (the weighted total decides). A name that matches none is
    refused in one sentence."""
    if not names:
        return None
    columns = []
    for name in names:
        hits = [i for i, (s, src) in enumerate(zip(specs, sources)) if name in (s.name, src)]
        if not hits:
            known = ", ".join(dict.fromkeys(s.name for s in specs))
            raise ConfigError(
                f"algo.dynamic_sampling_on names {name!r}, which is none of the run's reward functions ({known}); "
                "name some of them, task for the run's own reward (the task's verifier, or the functions passed to "
                "the Trainer), or leave it empty to judge groups by the reward as trained"
            )
        columns += hits
    return sorted(set(columns))


def check_reward_params(name: str, fn, given: dict) -> None:
    """Every key of reward.params.<name> must be a parameter the function names: a built-in's
    **kwargs are the dataset columns, so a typo there would be silently ignored. A user function
    that takes **kwargs may read any key, so only its named parameters are known to be valid."""
    import inspect

    target = getattr(fn, "func", fn)  # resolve_reward binds params with functools.partial
    try:
        sig = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return
    named = [p.name for p in sig if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    open_ended = any(p.kind is p.VAR_KEYWORD for p in sig) and ":" in name
    unknown = [k for k in given if k not in named]
    if unknown and not open_ended:
        raise ConfigError(
            f"reward.params.{name} has {', '.join(map(repr, unknown))}, which {name} does not take; "
            f"its parameters are: {', '.join(n for n in named if n not in ('prompts', 'completions'))}"
        )


def _import_hint(name: str) -> str:
    """What was searched for a "module:function" reward that could not be imported."""
    import os

    return f" (looked in the working directory {os.getcwd()} and on sys.path)" if ":" in name else ""


def grader(cfg: Config, specs: list[RewardSpec]) -> tuple[RewardSpec, int | None]:
    """The run's grader, the one place that decides it: the task's own verifier when there is a task,
    else the first of ``specs`` (the run's reward functions, as reward_specs gives them); and its index
    among ``specs``, None when the task's verifier is not one of them (reward.functions without "task")."""
    task = task_of(cfg)
    if task is None:
        return specs[0], 0
    names = cfg.reward.functions
    at = names.index("task") if "task" in names else None  # with a task no "task" entry is skipped
    return RewardSpec(fn=task.reward_fn, name="accuracy", weight=1.0), at


def eval_runner(cfg: Config, runner: RewardRunner) -> RewardRunner:
    """Evaluation grades with the run's grader (``grader``): the task's verifier when there is a task,
    else the first reward (the whole runner, whose first column the evaluator reads)."""
    if task_of(cfg) is None:
        return runner
    return RewardRunner([grader(cfg, runner.specs)[0]], num_workers=0, convention=cfg.reward.convention)


def process_function(cfg: Config):
    """The process reward for algo.advantage=process: the task's, or a named function, its answers checked
    (rewards/process_steps.py)."""
    name = cfg.reward.process_function
    if name == "task":
        from grpokit.data.tasks import get_task

        fn = get_task(cfg.data.task, cfg.data.task_params).process_reward_fn
        if fn is None:
            raise ConfigError(f"reward.process_function=task but task {cfg.data.task!r} has no process reward")
        return process_steps.checked(fn)
    return process_steps.checked(resolve_reward(name))
