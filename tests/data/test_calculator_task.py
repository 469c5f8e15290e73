"""The built-in multi-turn task: the calc demo model learns to reach for the calculator.

Greedy held-out accuracy starts near 0 (it answers from memory with an estimate) and, as GRPO makes
the tool call the more likely first token, jumps to ~1; the tool-use rate and the turns per episode
rise in the metrics. A short run with a relaxed threshold (docs/TASKS.md has the full measurement).
"""

import json

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.data.tasks import get_task
from grpokit.data.tasks.calculator import estimate, held_out_rows, is_held_out, train_rows
from grpokit.train import Trainer
from grpokit.train.task_evaluation import evaluate_task


def test_splits_and_teacher():
    assert all(not is_held_out(*map(int, r["prompt"][:-1].split("*"))) for r in train_rows(200))
    held = held_out_rows()
    assert len(held) == len({r["prompt"] for r in held}) and all(
        is_held_out(*map(int, r["prompt"][:-1].split("*"))) for r in held
    )
    assert estimate(57, 68) == 4200 and estimate(50, 20) == 1000 and estimate(95, 11) == 1000


def test_shipped_model_answers_from_memory_and_sometimes_calls_the_tool():
    task = get_task("calculator")
    model, tok = task.load_model()
    assert task.evaluate is None  # its episodes are scored by the train layer
    res = evaluate_task(task, model, tok, task.held_out_rows(100))
    assert res["accuracy"] <= 0.5 and res["tool_use_rate"] == 0.0 and res["turns_mean"] == 1.0


def test_calculator_task_learns_to_use_the_tool(tmp_path):
    cfg = apply_overrides(
        Config(),
        [
            "data.task=calculator",
            "train.steps=25",
            "data.eval_size=100",
            "record.sinks=[]",
            "record.report=false",
            f"train.out={tmp_path / 'run'}",
        ],
    )
    summary = Trainer(cfg, quiet=True).train()
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"reward"' in l]
    assert summary["eval_before"]["accuracy"] <= 0.5 and summary["eval_before"]["tool_use_rate"] == 0.0
    assert summary["eval_after"]["accuracy"] >= 0.8 and summary["eval_after"]["tool_use_rate"] >= 0.8, summary
    first = lambda k: sum(l[k] for l in lines[:3]) / 3  # noqa: E731
    last = lambda k: sum(l[k] for l in lines[-3:]) / 3  # noqa: E731
    assert last("episodes/tool_use_rate") > first("episodes/tool_use_rate") + 0.2
    assert last("episodes/turns_mean") > first("episodes/turns_mean") + 0.2


def test_grpokit_eval_scores_calculator_episodes():
    """grpokit eval --task calculator samples episodes with the task's model: the ~30% of sampled
    episodes that call the tool are right, where one-turn answers from memory almost never are."""
    from grpokit.cli.eval import parse_args, run_eval

    res = run_eval(parse_args(["--task", "calculator", "--limit", "16", "--k", "1,8", "--seed", "0"]))
    assert res["prompts"] == 16 and res["samples_per_prompt"] == 8
    assert 0.1 < res["pass@1"] < 0.6 and res["pass@8"] > 0.6, res
