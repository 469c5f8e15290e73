"""Greedy held-out scores of the built-in tasks whose evaluation needs the trainer's machinery: the
calculator task's episodes (the episode loop with the calculator tool) and the shapes task's image
prompts (the hf decode loop with the processor's tensors). The other tasks score themselves with
plain ``model.generate`` (``Task.evaluate``, data/tasks/evaluate.py); ``evaluate_task`` takes any::

    task = get_task("calculator")
    model, tokenizer = task.load_model()
    print(evaluate_task(task, model, tokenizer, task.held_out_rows(500))["accuracy"])

They live here, not beside their tasks in data/, because data/ sits below rollout/ and train/ in the
package layers (tests/project/test_layering.py).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from grpokit.data.tasks import Task
from grpokit.data.tasks.arithmetic import arithmetic_accuracy
from grpokit.data.tasks.shapes import shapes_reward
from grpokit.data.vision import encode_prompt
from grpokit.env.builtin import calculator
from grpokit.rewards.runner import RewardRunner
from grpokit.rewards.spec import RewardSpec
from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
from grpokit.rollout.hf import SamplingParams, generate
from grpokit.train.evaluate import evaluate
from grpokit.types import Prompt


def evaluate_task(task: Task, model: Any, tokenizer: Any, rows: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    """Greedy held-out scores of ``rows`` of a built-in task (``tokenizer``: the shapes task's processor)."""
    fn = EVALUATORS.get(task.name) or task.evaluate
    if fn is None:
        raise ValueError(f"the task {task.name!r} has no evaluator; tasks with one: {sorted(EVALUATORS)}")
    return fn(model, tokenizer, rows, **kwargs)


def evaluate_with_calculator(
    model: Any, tokenizer: Any, rows: list[dict[str, str]], *, max_new_tokens: int = 8, batch_size: int = 256
) -> dict[str, Any]:
    """Greedy held-out accuracy of episodes with the calculator (grpokit's episode loop and evaluator);
    adds ``tool_use_rate`` and ``turns_mean``."""
    runner = EpisodeRunner(EpisodeSpec(max_turns=4, tool_format="tags"), tokenizer, tools=[calculator])
    prompts = [
        Prompt(
            r["prompt"],
            list(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]),
            {"answer": r["answer"]},
            r["prompt"],
        )
        for r in rows
    ]
    eos = {tokenizer.eos_token_id}
    with RewardRunner([RewardSpec(fn=arithmetic_accuracy, name="accuracy")], num_workers=0) as rr, torch.no_grad():
        return evaluate(
            model,
            tokenizer,
            prompts,
            rr,
            params=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
            eos_token_ids=eos,
            batch_size=batch_size,
            episodes=runner,
        )


def evaluate_shapes(
    model, processor, rows: Sequence[dict[str, Any]], *, max_new_tokens: int = 16, **kwargs: Any
) -> dict[str, Any]:
    """Greedy held-out scores: ``reward`` (mean of IoU and count exactness), ``accuracy`` (reward 1),
    ``box_iou`` (mean IoU of the box questions) and ``count_accuracy``."""
    tok = processor.tokenizer
    enc = [encode_prompt(r, i, processor) for i, r in enumerate(rows)]
    ro = generate(
        model,
        [e[1] for e in enc],
        1,
        SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
        eos_token_ids={tok.eos_token_id},
        pad_token_id=tok.pad_token_id,
        vision=[e[2] for e in enc],
    )
    texts = [tok.decode(c, skip_special_tokens=True) for c in ro.completion_ids]
    kinds = [r["kind"] for r in rows]
    rewards = shapes_reward(None, texts, [r["answer"] for r in rows], kinds)
    box = [x for x, k in zip(rewards, kinds) if k == "box"]
    count = [x for x, k in zip(rewards, kinds) if k == "count"]
    return {
        "reward": sum(rewards) / len(rows),
        "accuracy": sum(x >= 1 - 1e-6 for x in rewards) / len(rows),
        "box_iou": sum(box) / max(1, len(box)),
        "count_accuracy": sum(count) / max(1, len(count)),
        "n": len(rows),
        "texts": texts,
    }


EVALUATORS = {"calculator": evaluate_with_calculator, "shapes": evaluate_shapes}
"""The tasks evaluated here rather than by their own ``Task.evaluate`` (None for them)."""
