"""reasoning-gym as a task library (data/tasks/reasoning_gym.py): rows from its generators with
their config, weighted mixtures, seeded disjoint held-out rows, its verifier under the one-answer
rule, one-sentence errors, and the same rows and reward through grpokit train and grpokit.trl."""

from __future__ import annotations

import json
import re

import pytest

from grpokit.config import ConfigError
from grpokit.data.tasks import get_task
from grpokit.data.tasks import reasoning_gym as rg
from helpers.trl_models import small_args

ADD = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 2,
    "max_digits": 2,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
    "instruction": "Answer with a number.",
}
QUESTION = re.compile(r"^Calculate (\d{1,2}) \+ (\d{1,2})\. Answer with a number\.$")


def test_rows_follow_the_config_and_the_gold_is_the_sum():
    task = get_task("reasoning_gym:basic_arithmetic", ADD)
    rows = task.train_rows(50, seed=0)
    for r in rows:
        a, b = map(
            int, QUESTION.match(r["prompt"]).groups()
        )  # operands of up to two digits (reasoning-gym: 0-99), "+" only
        assert r["answer"] == str(a + b) and r["rg_task"] == "basic_arithmetic"
    assert task.train_rows(50, seed=0) == rows  # deterministic in (n, seed)
    assert task.train_rows(50, seed=1) != rows


def test_held_out_rows_are_fixed_distinct_and_never_trained_on():
    task = get_task("reasoning_gym:basic_arithmetic", ADD)
    held = task.held_out_rows(300)
    assert len({r["prompt"] for r in held}) == 300  # distinct questions
    assert get_task("reasoning_gym:basic_arithmetic", ADD).held_out_rows(300) == held  # the same for every run
    seen = {r["prompt"] for r in task.train_rows(3000, seed=7)}
    pool = {r["prompt"] for r in task.held_out_rows(rg.HELD_OUT_POOL)}
    assert not seen & pool  # 8,100 possible sums: without the exclusion some would overlap


def test_a_mixture_draws_each_task_in_proportion_to_its_weight():
    task = get_task("reasoning_gym:leg_counting=3,chain_sum", {"leg_counting": {"min_animals": 1, "max_animals": 2}})
    rows = task.train_rows(400, seed=0)
    share = sum(r["rg_task"] == "leg_counting" for r in rows) / len(rows)
    assert 0.68 < share < 0.82  # 3/4 expected; 400 draws: standard error 0.022
    legs = [r for r in rows if r["rg_task"] == "leg_counting"]
    assert all(json.loads(r["rg_source"])["config"] == {"min_animals": 1, "max_animals": 2} for r in legs)
    assert all(r["prompt"].endswith(rg.DEFAULT_INSTRUCTION) for r in rows)


def test_the_verifier_pays_one_answer_and_never_a_hedge():
    task = get_task("reasoning_gym:basic_arithmetic", ADD)
    row = task.held_out_rows(1)[0]
    gold = int(row["answer"])
    completions = [
        f"The answer is {gold}.",  # a phrase: 1
        f"{gold - 20} + 20 = {gold}",  # the last number of the last line: 1
        f"<answer>{gold}</answer>",  # tags: 1
        f"{gold} or {gold + 1}",  # a hedge: 0
        f"<answer>{gold}</answer> <answer>{gold + 1}</answer>",  # two answers that disagree: 0
        f"The answer is {gold + 1}.",  # wrong: 0
        "I do not know.",  # no number: 0
        f"I will put it in <answer></answer>.\n<answer>{gold}</answer>",  # an empty tag is no answer: 1 (0 before)
        f"<answer></answer><answer>{gold}</answer><answer>{gold + 1}</answer>",  # two real answers disagree: 0
    ]
    scores = task.reward_fn(completions, rg_source=[row["rg_source"]] * 9, prompts=[row["prompt"]] * 9)
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    ds, entry = rg._entry(row["rg_source"])
    assert ds.score_answer(f"{gold} or {gold + 1}", entry) > 0  # what the one-answer rule takes away


@pytest.mark.slow
def test_every_reasoning_gym_task_generates_and_its_gold_scores_full():
    """`data.task=reasoning_gym:<name>` for any of its tasks: the gold answer in tags earns what
    reasoning-gym's own scorer gives it (1.0)."""
    names = [n for n in rg._registry() if n != "composite"]
    assert len(names) >= 100
    wrong = []
    for name in names:
        row = rg.make_rows({name: 1.0}, {name: {}}, "", 1, seed=5)[0]
        ds, entry = rg._entry(row["rg_source"])
        ours = rg.reasoning_gym_accuracy(
            [f"<answer>{row['answer']}</answer>"], [row["rg_source"]], prompts=[row["prompt"]]
        )[0]
        if ours != ds.score_answer(row["answer"], entry):
            wrong.append(name)
    assert wrong == []


@pytest.mark.parametrize(
    "task, params, message",
    [
        ("reasoning_gym:no_such_task", {}, r"'no_such_task' is not a reasoning-gym task; valid: ab, acre"),
        ("reasoning_gym:chain_sum=x", {}, r"the weight of 'chain_sum' must be a number, got 'x'"),
        ("reasoning_gym:chain_sum=0", {}, r"the weight of 'chain_sum' must be > 0"),
        (
            "reasoning_gym:chain_sum",
            {"bogus": 1},
            r"task_params for reasoning-gym's 'chain_sum' is not a valid config .*bogus",
        ),
        (
            "reasoning_gym:chain_sum,leg_counting",
            {"min_terms": 2},
            r"maps each task name to its config; min_terms is not one of",
        ),
        ("arithmetic", {"min_terms": 2}, r"data.task_params is for reasoning_gym:<name> tasks"),
        ("no_such_task", {}, r"not a built-in task; valid: .*reasoning_gym:<name>"),
    ],
)
def test_bad_task_settings_are_one_sentence(task, params, message):
    with pytest.raises(ConfigError, match=message):
        get_task(task, params)


def test_a_reasoning_gym_task_with_the_demo_model_asks_for_a_real_model(tmp_path, capsys):
    from grpokit.cli import main

    assert main(["train", "data.task=reasoning_gym:chain_sum", f"train.out={tmp_path / 'run'}"]) == 2
    assert (
        "has no demo model; set model.name_or_path to a real model (e.g. smollm2-135m-instruct"
        in capsys.readouterr().err
    )


@pytest.mark.slow
def test_grpokit_train_on_a_reasoning_gym_task_with_the_real_model(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "grpokit",
        "train",
        "--preset",
        "smollm2-math",
        f"--out={out}",
        "train.steps=1",
        "train.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=6",
        "data.eval_size=4",
        "train.eval_every=0",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_before"]["n"] == 4 and 0.0 <= summary["eval_before"]["accuracy"] <= 1.0
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert "rewards/reasoning_gym_accuracy/mean" in step
    import yaml

    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["data"]["task"] == "reasoning_gym:basic_arithmetic" and cfg["data"]["task_params"]["max_digits"] == 2
    assert cfg["model"]["name_or_path"] == "smollm2-135m-instruct"


@pytest.mark.slow
def test_the_same_rows_and_reward_through_grpokit_trl(tmp_path):
    from grpokit.trl import GRPOConfig, GRPOTrainer, reasoning_gym_accuracy, reasoning_gym_dataset

    data = reasoning_gym_dataset("reasoning_gym:basic_arithmetic", 8, seed=0, params=ADD)
    assert data[0]["prompt"] == [
        {"role": "user", "content": get_task("reasoning_gym:basic_arithmetic", ADD).train_rows(1)[0]["prompt"]}
    ]
    held = reasoning_gym_dataset("reasoning_gym:basic_arithmetic", 4, params=ADD, split="held_out")
    assert held["answer"] == [r["answer"] for r in get_task("reasoning_gym:basic_arithmetic", ADD).held_out_rows(4)]
    args = small_args(GRPOConfig, tmp_path / "run", max_steps=1, num_generations=2, report_to=[])
    trainer = GRPOTrainer("smollm2-135m-instruct", reward_funcs=[reasoning_gym_accuracy], train_dataset=data, args=args)
    assert trainer.train().global_step == 1


def test_an_answer_slot_left_empty_is_no_answer():
    # Before, the blank tag or box was dropped and the last line ("6*7 = 42") was read as the answer: 42.
    assert rg.one_answer("6*7 = 42\n<answer></answer>", "42") is None
    assert rg.one_answer("so 42\n\\boxed{}", "42") is None
    assert rg.one_answer("I must box it: \\boxed{}.\n\\boxed{42}", "42") == "42"  # a real box remains
