"""Built-in verifiable tasks and the tiny demo model that ships with grpokit.

A task bundles what the trainer needs to run without any user data: training rows
(``{"prompt", "answer"}`` dicts), held-out rows for evaluation, a reward function in TRL's
convention and the default starting checkpoint. ``arithmetic`` (two-digit addition, single-turn) is
the default; ``calculator`` (two-digit multiplication with a calculator tool) is multi-turn: its
``tools`` make every sample an episode (docs/AGENTS.md). Look one up by name::

    task = get_task("arithmetic")
    rows = task.train_rows(n=4096, seed=0)
    model, tokenizer = task.load_model()
    print(task.evaluate(model, tokenizer, task.held_out_rows(500))["accuracy"])

(``grpokit.train.task_evaluation.evaluate_task`` scores any task, the calculator's episodes and the
shapes task's image prompts included.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from . import arithmetic, calculator, reasoning_gym, shapes
from .arithmetic_steps import digit_steps
from .demo_model import demo_model_path, load_demo_model
from .evaluate import evaluate_accuracy


@dataclass(frozen=True)
class Task:
    """A named built-in task (all members are plain functions; see the module docstring)."""

    name: str
    train_rows: Callable[..., list[dict[str, str]]]
    """``train_rows(n, seed=0)``: n training rows, deterministic in (n, seed)."""
    held_out_rows: Callable[..., list[dict[str, str]]]
    """``held_out_rows(n=None)``: evaluation rows, disjoint from every training row."""
    reward_fn: Callable[..., list[float]]
    """``reward_fn(prompts, completions, answer, **kwargs) -> list[float]``."""
    evaluate: Callable[..., dict[str, Any]] | None
    """``evaluate(model, tokenizer, rows, ...)``: greedy accuracy dict with plain ``model.generate``;
    None for a task that needs the episode loop or image prompts (``grpokit.train.task_evaluation.
    evaluate_task`` scores every task)."""
    model_path: Callable[[], Path]
    """Folder of the default starting checkpoint."""
    load_model: Callable[..., tuple[Any, Any]]
    """``load_model(path=None) -> (model, tokenizer)``."""
    recommended: Mapping[str, Any]
    """Training settings measured to work on this task's default model (see docs/TASKS.md)."""
    process_reward_fn: Callable[..., list[list[tuple[int, float]]]] | None = None
    """Per-step rewards ``[(end_token, reward), ...]`` per completion, for process supervision."""
    tools: tuple[Callable, ...] = ()
    """Tools the task's episodes may call (multi-turn tasks); used when env.tools is empty."""
    demo: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Config fields (dotted names) of the demo: applied when this task runs on its own demo model
    (model.name_or_path=demo), to the fields nobody set; a user's model keeps Config()'s defaults."""


# The demo model's answers are at most 4 characters (3 digits + EOS): 8 new tokens leave room; the
# tiny model needs a large learning rate; 60 steps reach ~99% held-out accuracy; no checkpoints but
# the final one (a checkpoint costs more than a step).
DEMO = MappingProxyType({"rollout.max_new_tokens": 8, "optim.lr": 3e-4, "train.steps": 60, "train.save_every": 0})


# The visual demo: box answers are at most 13 characters + EOS; eval on 200 held-out scenes. The
# pre-warmed model is sharp already (entropy ~0.23 at temperature 1.2): lr 1e-3 collapsed an earlier
# one; 150 steps (~80 s of CPU) at lr 2e-4 take the box question's held-out mean IoU from 0.25 to
# 0.35-0.39 and counting up too; 3e-4 gains more box IoU but collapsed the count answers of one seed
# into one text per scene (docs/VISION.md).
SHAPES_DEMO = MappingProxyType(
    {
        "rollout.max_new_tokens": 16,
        "optim.lr": 2e-4,
        "rollout.temperature": 1.2,
        "train.steps": 150,
        "train.save_every": 0,
        "data.eval_size": 200,
    }
)


TASKS: dict[str, Task] = {
    "arithmetic": Task(
        name="arithmetic",
        train_rows=arithmetic.train_rows,
        held_out_rows=arithmetic.held_out_rows,
        reward_fn=arithmetic.arithmetic_accuracy,
        evaluate=evaluate_accuracy,
        model_path=demo_model_path,
        load_model=load_demo_model,
        # Measured with a bare group-relative policy-gradient loop on one CPU thread: greedy
        # held-out accuracy 0.23 -> >= 0.90 within ~10 steps (~2 s), ~0.99 by step 60.
        recommended=MappingProxyType(
            {
                "prompts_per_step": 16,
                "group_size": 8,
                "learning_rate": 3e-4,
                "temperature": 1.0,
                "max_new_tokens": 8,
                "steps": 60,
                "eval_rows": 500,
            }
        ),
        process_reward_fn=digit_steps,
        demo=DEMO,
    ),
    "calculator": Task(
        name="calculator",
        train_rows=calculator.train_rows,
        held_out_rows=calculator.held_out_rows,
        reward_fn=arithmetic.arithmetic_accuracy,
        evaluate=None,  # episodes with the calculator: grpokit.train.task_evaluation
        model_path=calculator.calc_model_path,
        load_model=calculator.load_calc_model,
        recommended=MappingProxyType(
            {
                "prompts_per_step": 16,
                "group_size": 8,
                "learning_rate": 3e-4,
                "temperature": 1.0,
                "max_new_tokens": 8,
                "max_turns": 4,
                "eval_rows": 500,
            }
        ),
        tools=(calculator.calculator,),
        demo=DEMO,
    ),
    "shapes": Task(
        name="shapes",
        train_rows=shapes.train_rows,
        held_out_rows=shapes.held_out_rows,
        reward_fn=shapes.shapes_reward,
        evaluate=None,  # image prompts: grpokit.train.task_evaluation
        model_path=shapes.shapes_model_path,
        load_model=shapes.load_shapes_model,
        # Measured on 2 shared CPU cores (docs/VISION.md): held-out reward rises within the demo's steps.
        recommended=MappingProxyType(
            {
                "prompts_per_step": 16,
                "group_size": 8,
                "learning_rate": 2e-4,
                "temperature": 1.2,
                "max_new_tokens": 16,
                "steps": 150,
                "eval_rows": 200,
            }
        ),
        demo=SHAPES_DEMO,
    ),
}


def get_task(name: str, params: Mapping[str, Any] | None = None) -> Task:
    """The built-in task called ``name``, or reasoning-gym's ``reasoning_gym:<name>[=weight],...``
    with ``params`` (data.task_params) as its config; a ConfigError lists the valid names otherwise."""
    from grpokit.config.sections import ConfigError

    if name.startswith(reasoning_gym.PREFIX):
        return _reasoning_gym_task(name, dict(params or {}))
    if name not in TASKS:
        raise ConfigError(
            f"data.task={name!r} is not a built-in task; valid: {', '.join(sorted(TASKS))}, or "
            "reasoning_gym:<name> (docs/TASKS.md) (or set data.task= and data.dataset=FILE)"
        )
    if params:
        raise ConfigError(f"data.task_params is for reasoning_gym:<name> tasks; the built-in task {name!r} takes none")
    return TASKS[name]


def _reasoning_gym_task(name: str, params: dict) -> Task:
    """A reasoning-gym task (data/tasks/reasoning_gym.py): its rows, its verifier under grpokit's
    one-answer rule, seeded held-out rows; it has no demo model (a real model is needed)."""
    train_rows, held_out_rows = reasoning_gym.rows_for(name, params)

    def needs_a_model(*args: Any, **kwargs: Any):
        from grpokit.config.sections import ConfigError

        raise ConfigError(
            f"data.task={name!r} has no demo model; set model.name_or_path to a real model "
            "(e.g. smollm2-135m-instruct, grpokit models lists the named ones)"
        )

    return Task(
        name=name,
        train_rows=train_rows,
        held_out_rows=held_out_rows,
        reward_fn=reasoning_gym.reasoning_gym_accuracy,
        evaluate=evaluate_accuracy,
        model_path=needs_a_model,
        load_model=needs_a_model,
        recommended=MappingProxyType({}),
    )


__all__ = ["TASKS", "Task", "get_task", "demo_model_path", "load_demo_model", "evaluate_accuracy"]
