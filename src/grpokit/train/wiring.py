"""Wiring a run from its config: data rows, reward functions, the evaluator's verifier, the
process reward, and small helpers of the loop. Kept apart from train.py so the loop reads top to
bottom; nothing here holds math.
"""

from __future__ import annotations

import time
from typing import Callable


from grpokit.config.sections import Config, ConfigError
from grpokit.data.prompts import load_rows
from grpokit.rewards.inputs import reward_inputs, reward_prompts  # noqa: F401 (the loop's names for them)
from grpokit.rewards.runner import RewardRunner
from grpokit.rewards.spec import RewardError, RewardSpec, resolve_reward
from .memory import PhasePeaks

TASK_TRAIN_ROWS = 8192  # rows drawn from a built-in task's training split (the sampler cycles them)


def _task(cfg: Config):
    """The built-in task of this run, or None when the run brings its own data (data.dataset)."""
    from grpokit.data.tasks import get_task

    return get_task(cfg.data.task) if cfg.data.task and not cfg.data.dataset else None


def resolve_run(cfg: Config, own_rows: bool = False) -> Config:
    """Settle what depends on the run, in place: one's own data (``data.dataset``, or rows passed to
    the Trainer: ``own_rows``) replaces the built-in task, its reward and its held-out set
    (data.task becomes ""); the demo (a task on its own demo model) fills the fields nobody set with
    the task's demo settings; model.name_or_path=demo becomes the task's own checkpoint (the
    calculator task ships one that knows the tool tags), which config.yaml then records."""
    from grpokit.config.io import assigned, set_field

    if cfg.data.dataset or own_rows:
        cfg.data.task = ""
    task = _task(cfg)
    if task is None or cfg.model.name_or_path != "demo":
        return cfg
    given = assigned(cfg)
    for name, value in task.demo.items():
        if name not in given:
            set_field(cfg, name, value)
    if task.name != "arithmetic":
        cfg.model.name_or_path = str(task.model_path())
    return cfg


def use_task_model(cfg: Config) -> None:
    """model.name_or_path=demo means the built-in task's own checkpoint (for ``grpokit eval``)."""
    task = _task(cfg)
    if task is not None and cfg.model.name_or_path == "demo" and task.name != "arithmetic":
        cfg.model.name_or_path = str(task.model_path())


def new_run_dir(name: str) -> str:
    """``name``, or ``name-2``, ``name-3`` ... when a run started in the same second holds it."""
    from pathlib import Path

    k, out = 1, name
    while Path(out).exists():
        k += 1
        out = f"{name}-{k}"
    return out


def data_rows(cfg: Config, train_rows: list[dict] | None, eval_rows: list[dict] | None) -> tuple[list[dict], list[dict]]:
    """Training and held-out rows: given ones, else the built-in task's, else the configured files.
    One's own data is evaluated on data.eval_dataset (or given eval_rows) or not at all, never on the
    task's held-out set."""
    d = cfg.data
    task = _task(cfg) if train_rows is None else None
    if train_rows is None:
        if not (task or d.dataset):
            raise ConfigError("data.task and data.dataset are both empty; set one (e.g. data.task=arithmetic or data.dataset=train.jsonl)")
        train_rows = task.train_rows(TASK_TRAIN_ROWS, seed=cfg.train.seed) if task else load_rows(d.dataset, d.split, d)
    if eval_rows is None:
        if d.eval_dataset:
            eval_rows = load_rows(d.eval_dataset, d.eval_split, d)
        else:
            eval_rows = task.held_out_rows(d.eval_size) if task else []
    return train_rows, eval_rows[: d.eval_size]


def reward_specs(cfg: Config, extra: list[Callable] | None, environment_factory=None) -> list[RewardSpec]:
    """The configured reward functions (built-in names, import paths, "task") plus passed callables,
    plus each environment class's ``get_reward()`` (weight 1, named after its class, as TRL).
    "task" is the built-in task's reward; with one's own data, passed callables take its place."""
    from grpokit.env import environment_rewards

    env_rewards = environment_rewards(environment_factory)
    passed = list(extra or [])
    names, weights = cfg.reward.functions, cfg.reward.weights or [1.0] * len(cfg.reward.functions)
    if len(weights) not in (len(names), len(names) + len(passed)):
        raise ConfigError(f"reward.weights has {len(weights)} entries but there are {len(names) + len(passed)} reward functions "
                          f"({len(names)} in reward.functions, {len(passed)} passed as callables); give one weight per function "
                          "(the named ones first, then the callables in order) or none")
    extra_weights = weights[len(names):] or [1.0] * len(passed)  # the environment's own reward has weight 1, as TRL
    extra = passed + env_rewards
    extra_weights = list(extra_weights) + [1.0] * (len(extra) - len(passed))
    task = _task(cfg)
    specs = []
    for name, w in zip(names, weights):
        if name == "task" and extra and task is None:
            continue  # the "task" reward makes no sense without a task: the passed functions replace it
        if name == "task":
            if task is None:
                raise ConfigError("reward.functions names 'task' (the built-in task's reward) but the run trains on its own "
                                  "data; name its reward instead (e.g. reward.functions=[math_accuracy]) or pass reward_funcs")
            specs.append(RewardSpec(fn=task.reward_fn, name=getattr(task.reward_fn, "__name__", "task"), weight=w))
        else:
            params = reward_params(cfg, name)
            try:
                fn = resolve_reward(name, **params)
            except RewardError as e:
                raise ConfigError(f"reward.functions: {e}{_import_hint(name)}") from None
            check_reward_params(name, fn, cfg.reward.params.get(name, {}))
            specs.append(RewardSpec(fn=fn, name=name.split(":")[-1], weight=w))
    if extra:
        specs += [RewardSpec(fn=f, name=getattr(f, "__name__", f"reward_{i}"), weight=w) for i, (f, w) in enumerate(zip(extra, extra_weights))]
    if not specs:
        raise ConfigError("reward.functions is empty and no reward function was passed; name at least one (e.g. task)")
    return specs


OVERLONG_CACHE_FRACTION = 0.2  # DAPO: a 4,096-token punishment cache under its 20,480-token limit


def reward_params(cfg: Config, name: str) -> dict:
    """reward.params of one function; overlong_penalty's window follows the run's generation length
    (max_length = rollout.max_new_tokens, cache_length = DAPO's fifth of it) unless set."""
    params = dict(cfg.reward.params.get(name, {}))
    if name == "overlong_penalty":
        params.setdefault("max_length", cfg.rollout.max_new_tokens)
        params.setdefault("cache_length", max(1, round(OVERLONG_CACHE_FRACTION * params["max_length"])))
    return params


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
        raise ConfigError(f"reward.params.{name} has {', '.join(map(repr, unknown))}, which {name} does not take; "
                          f"its parameters are: {', '.join(n for n in named if n not in ('prompts', 'completions'))}")


def _import_hint(name: str) -> str:
    """What was searched for a "module:function" reward that could not be imported."""
    import os

    return f" (looked in the working directory {os.getcwd()} and on sys.path)" if ":" in name else ""


def check_gold_answers(cfg: Config, rows: list[dict]) -> None:
    """With math_accuracy, parse every gold answer at load time: a gold that does not parse is
    reported (math_accuracy skips it), never silently scored."""
    if "math_accuracy" not in cfg.reward.functions:
        return
    from grpokit.rewards.math import validate_gold_answers  # lazy: sympy only for math_accuracy runs

    report = validate_gold_answers([r.get("answer") for r in rows])
    if report.num_valid == 0:
        raise ConfigError(f"math_accuracy: none of the {len(rows)} gold answers parses ({report.message()}); check data.answer_column")
    if report.invalid:
        print(f"grpokit: warning: {report.message()}", flush=True)


def eval_runner(cfg: Config, runner: RewardRunner) -> RewardRunner:
    """Evaluation grades with the task's own verifier when there is a task, else the first reward."""
    task = _task(cfg)
    if task is None:
        return runner
    return RewardRunner([RewardSpec(fn=task.reward_fn, name="accuracy", weight=1.0)], num_workers=0)


def process_function(cfg: Config):
    """The process reward for algo.supervision=process: the task's, or a named function."""
    name = cfg.reward.process_function
    if name == "task":
        from grpokit.data.tasks import get_task

        fn = get_task(cfg.data.task).process_reward_fn
        if fn is None:
            raise ConfigError(f"reward.process_function=task but task {cfg.data.task!r} has no process reward")
        return fn
    return resolve_reward(name)


# ---------------------------------------------------------------- episodes (multi-turn, tools)


def episode_runner(cfg: Config, tokenizer, tools: list[Callable] | None, environment_factory, task=None):
    """The episode loop for this run: the configured tools (``env.tools``, the task's, or passed
    callables) and environment (``env.environment`` or a passed ``environment_factory``: one factory, or a
    dict name -> factory routed per row by its ``environment`` column)."""
    from grpokit.data.prompts import render_prompt, with_observation
    from grpokit.env import resolve_environment, resolve_tools
    from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec

    e = cfg.env
    fns = resolve_tools(e.tools, wall_s=e.tool_timeout_s, allow_unsafe_code_execution=e.allow_unsafe_code_execution)
    fns += list(tools or [])
    if task is not None and not fns:
        fns = list(task.tools)
    factory = environment_factory or resolve_environment(e.environment)
    fmt = e.tool_format
    if fmt == "auto":
        fmt = "chat_template" if getattr(tokenizer, "chat_template", None) and cfg.data.chat_template != "never" else "tags"
    if fmt == "chat_template" and not getattr(tokenizer, "chat_template", None):
        raise ConfigError("env.tool_format=chat_template but the tokenizer has no chat template; use tags or auto")
    multi = bool(fns) or bool(factory)
    spec = EpisodeSpec(max_turns=e.max_turns if multi else 1, max_episode_tokens=e.max_episode_tokens,
                       tool_timeout_s=e.tool_timeout_s, episode_timeout_s=e.episode_timeout_s,
                       max_tool_output_chars=e.max_tool_output_chars, tool_format=fmt,
                       max_tool_nesting=e.max_tool_nesting, reset_timeout_s=e.reset_timeout_s,
                       max_observation_chars=e.max_observation_chars, max_failure_fraction=e.max_failure_fraction)
    runner = EpisodeRunner(spec, tokenizer, tools=fns, environment_factory=factory)
    if fmt == "chat_template":  # a reset() observation joins the last user message, re-rendered with the row's tools
        runner.render_prompt = lambda raw, obs, schemas: list(tokenizer(
            render_prompt(with_observation(raw, obs), tokenizer, cfg.data, schemas),
            add_special_tokens=False)["input_ids"])
    return runner


def call_rollout_func(fn: Callable, trainer, prompts, group_size: int):
    """TRL's ``rollout_func(prompts, trainer) -> dict``: ``prompt_ids`` (one per prompt or per
    completion), ``completion_ids`` and ``logprobs`` (G per prompt, grouped), optional ``env_mask``
    (1 on the model's tokens, 0 on the environment's); other keys go to the reward functions."""
    from grpokit.types import Episode, Rollout

    out = fn([p.raw if p.raw is not None else p.text for p in prompts], trainer)
    missing = sorted({"prompt_ids", "completion_ids", "logprobs"} - set(out))
    if missing:
        raise ConfigError(f"rollout_func must return the keys {missing} in its dict (TRL's convention)")
    comps, N = out["completion_ids"], len(prompts) * group_size
    if len(comps) != N:
        raise ConfigError(f"rollout_func returned {len(comps)} completions for {len(prompts)} prompts; "
                          f"it must return group_size={group_size} per prompt, grouped")
    pids = out["prompt_ids"]
    pids = pids[::group_size] if len(pids) == N else pids
    mask = out.get("env_mask")
    episodes = [Episode(list(m), [0] * len(m)) for m in mask] if mask is not None else None
    ro = Rollout([list(p) for p in pids], [list(c) for c in comps], [list(lp) for lp in out["logprobs"]],
                 list(out.get("finish_reasons") or ["eos"] * N), group_size, episodes)
    extra = {k: list(v) for k, v in out.items()
             if k not in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "finish_reasons")}
    return ro, extra


def add_logged_columns(rows: list[dict], extra: dict[str, list], group_size: int) -> list[dict]:
    """Put reward functions' ``log_extra`` values beside each completion of sample rows (row p holds
    completions p*G .. p*G+G-1), as TRL adds them to its completions table."""
    for p, row in enumerate(rows):
        for g, comp in enumerate(row["completions"]):
            logged = {k: v[p * group_size + g] for k, v in extra.items() if v[p * group_size + g] is not None}
            if logged:
                comp["extra"] = logged
    return rows


class Timer:
    """Seconds per named phase of one step (a phase may be entered several times), and with a
    memory provider (memory.py, CUDA) the peak GPU memory per phase."""

    def __init__(self, memory=None):
        self.spans: dict[str, float] = {}
        self.t0 = time.perf_counter()
        self.memory = PhasePeaks(memory) if memory is not None else None

    def __call__(self, name: str):
        timer = self

        class _Span:
            def __enter__(self):
                self.start = time.perf_counter()
                timer.memory.enter(name) if timer.memory is not None else None

            def __exit__(self, *exc):
                timer.spans[name] = timer.spans.get(name, 0.0) + time.perf_counter() - self.start
                timer.memory.exit(name) if timer.memory is not None else None

        return _Span()

    def total(self) -> float:
        return time.perf_counter() - self.t0

    def metrics(self) -> dict[str, float]:
        return {**{f"time/{k}": v for k, v in self.spans.items()}, "time/step": self.total(),
                **(self.memory.metrics() if self.memory is not None else {})}




class GracefulStop:
    """Ctrl-C during training: the first SIGINT asks the loop to stop after the step in progress
    (``requested``), which then writes a checkpoint, the summary and the report; a second one
    interrupts at once (KeyboardInterrupt). Only a single process in the main thread installs the
    handler: under torchrun every rank gets the signal at its own point, and they must not wait for
    each other at different steps."""

    def __init__(self, enabled: bool = True):
        import signal
        import threading

        self.requested = False
        self._signal = signal
        self._enabled = enabled and threading.current_thread() is threading.main_thread()
        self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\ngrpokit: stopping after the current step (a checkpoint and the report follow); "
              "Ctrl-C again to stop at once", flush=True)

    def install(self) -> None:
        if self._enabled:
            self._previous = self._signal.signal(self._signal.SIGINT, self._handle)

    def uninstall(self) -> None:
        if self._enabled and self._previous is not None:
            self._signal.signal(self._signal.SIGINT, self._previous)
            self._previous = None
