"""Wiring a run from its config: data rows, reward functions, the evaluator's verifier, the
process reward, and small helpers of the loop. Kept apart from train.py so the loop reads top to
bottom; nothing here holds math.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from .advantages import process_advantages
from .collect import ScoredBatch
from .config import Config, ConfigError
from .data import load_rows, repeat_columns
from .rewards.runner import RewardRunner
from .rewards.spec import RewardError, RewardSpec, resolve_reward

TASK_TRAIN_ROWS = 8192  # rows drawn from a built-in task's training split (the sampler cycles them)


def _task(cfg: Config):
    from .tasks import get_task

    return get_task(cfg.data.task) if cfg.data.task and not cfg.data.dataset else None


def data_rows(cfg: Config, train_rows: list[dict] | None, eval_rows: list[dict] | None) -> tuple[list[dict], list[dict]]:
    """Training and held-out rows: given ones, else the built-in task's, else the configured files."""
    d = cfg.data
    task = _task(cfg) if train_rows is None or eval_rows is None else None
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


def reward_specs(cfg: Config, extra: list[Callable] | None) -> list[RewardSpec]:
    """The configured reward functions (built-in names, import paths, "task") plus passed callables."""
    names, weights = cfg.reward.functions, cfg.reward.weights or [1.0] * len(cfg.reward.functions)
    specs = []
    for name, w in zip(names, weights):
        if name == "task" and extra and not cfg.data.task:
            continue  # the default "task" reward makes no sense without a task: the passed functions replace it
        if name == "task":
            if not cfg.data.task:
                raise ConfigError("reward.functions names 'task' but data.task is empty; name a reward function instead")
            from .tasks import get_task

            fn = get_task(cfg.data.task).reward_fn
            specs.append(RewardSpec(fn=fn, name=getattr(fn, "__name__", "task"), weight=w))
        else:
            params = cfg.reward.params.get(name, {})
            try:
                fn = resolve_reward(name, **params)
            except RewardError as e:
                raise ConfigError(f"reward.functions: {e}") from None
            specs.append(RewardSpec(fn=fn, name=name.split(":")[-1], weight=w))
    if extra:
        specs += [RewardSpec(fn=f, name=getattr(f, "__name__", f"reward_{i}"), weight=1.0) for i, f in enumerate(extra)]
    if not specs:
        raise ConfigError("reward.functions is empty and no reward function was passed; name at least one (e.g. task)")
    return specs


def check_gold_answers(cfg: Config, rows: list[dict]) -> None:
    """With math_accuracy, parse every gold answer at load time: a gold that does not parse is
    reported (math_accuracy skips it), never silently scored."""
    if "math_accuracy" not in cfg.reward.functions:
        return
    from .rewards import validate_gold_answers

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
        from .tasks import get_task

        fn = get_task(cfg.data.task).process_reward_fn
        if fn is None:
            raise ConfigError(f"reward.process_function=task but task {cfg.data.task!r} has no process reward")
        return fn
    return resolve_reward(name)


def step_advantages(process_fn, sb: ScoredBatch, width: int, std: str, eps: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Process supervision: ask the process reward for (end token, reward) steps, pad them into
    tensors and turn them into per-token advantages ``(N, width)``."""
    G = sb.group_size
    columns = repeat_columns(sb.prompts, G)
    prompts = [p.text for p in sb.prompts for _ in range(G)]
    steps = process_fn(prompts, sb.texts, completion_ids=sb.rollout.completion_ids, **columns)
    S = max(1, max(len(s) for s in steps))
    rewards, ends, mask = torch.zeros(len(steps), S), torch.zeros(len(steps), S, dtype=torch.long), torch.zeros(len(steps), S)
    for i, seq in enumerate(steps):
        for k, (end, value) in enumerate(seq):
            rewards[i, k], ends[i, k], mask[i, k] = float(value), int(end), 1.0
    return process_advantages(rewards, ends, mask, G, width, std=std, eps=eps)


class Timer:
    """Seconds per named phase of one step (a phase may be entered several times)."""

    def __init__(self):
        self.spans: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def __call__(self, name: str):
        timer = self

        class _Span:
            def __enter__(self):
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                timer.spans[name] = timer.spans.get(name, 0.0) + time.perf_counter() - self.start

        return _Span()

    def total(self) -> float:
        return time.perf_counter() - self.t0

    def metrics(self) -> dict[str, float]:
        return {**{f"time/{k}": v for k, v in self.spans.items()}, "time/step": self.total()}


