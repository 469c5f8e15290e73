"""Every value derived from a setting a stage of train.stages changes follows the stage: overlong_penalty's
window (derived from rollout.max_new_tokens) in the stage's steps and after a resume in the middle of a stage,
a window the user gave stays as given, and the memory plan is made for the run's largest stage."""

import json
import shutil

import pytest

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.config.sections import ConfigError
from grpokit.train import Trainer, reward_setup
from grpokit.train.stages import run_values
from helpers.runs import ROWS, likes_a, make, tiny_cfg

STAGES = "[{steps: 1, max_new_tokens: 6}, {steps: 2, max_new_tokens: 20}]"


def window(fn) -> tuple[int, int]:
    return fn.keywords["max_length"], fn.keywords["cache_length"]


def test_the_derived_window_follows_the_config_as_it_is_now():
    cfg = apply_overrides(Config(), ["data.task=", "reward.functions=[overlong_penalty]", "rollout.max_new_tokens=6"])
    specs = reward_setup.reward_specs(cfg, [likes_a])
    assert window(specs[0].fn) == (6, 1)  # max_length 6, cache round(0.2 * 6) = 1
    cfg.rollout.max_new_tokens = 20  # what a stage does
    followed = reward_setup.follow_settings(cfg, specs)
    assert window(followed[0].fn) == (20, 4)  # max_length 20, cache round(0.2 * 20) = 4
    assert followed[1] is specs[1]  # the passed function is kept as it is
    cfg.reward.params = {"overlong_penalty": {"cache_length": 2}}  # a given cache stays; max_length follows
    assert window(reward_setup.follow_settings(cfg, specs)[0].fn) == (20, 2)
    cfg.reward.params = {"overlong_penalty": {"max_length": 8, "cache_length": 2}}  # a given window stays whole
    given = reward_setup.reward_specs(cfg, None)
    cfg.rollout.max_new_tokens = 40
    assert reward_setup.follow_settings(cfg, given)[0] is given[0] and window(given[0].fn) == (8, 2)


def test_a_stage_length_below_a_given_cache_is_refused_at_start(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError) as e:
        make(
            tiny_model_dir,
            tmp_path / "run",
            **{
                "reward.functions": "[overlong_penalty]",
                "reward.params": "{overlong_penalty: {cache_length: 4}}",
                "train.stages": "[{steps: 1}, {steps: 1, max_new_tokens: 3}]",
            },
        )
    assert str(e.value) == (
        "train.stages[1]: reward.params.overlong_penalty: cache_length=4 must be > 0 and at most max_length=3 "
        "(rollout.max_new_tokens=3); give a cache_length in that range, or a max_length of its own"
    )


def expected(length: int, max_length: int, cache: int) -> float:
    """DAPO's soft overlong punishment by hand: 0 up to max - cache, then linear to -1 at max."""
    start = max_length - cache
    return 0.0 if length <= start else (start - length) / cache


def check_windows(samples_path, windows: dict[int, tuple[int, int]]) -> int:
    """Every logged completion's overlong_penalty is its step's window's; returns how many completions of
    the 20-token stage ended inside it (lengths <= 16 score 0 there, -1 under a stale 6-token window)."""
    inside = 0
    for row in map(json.loads, samples_path.read_text().splitlines()):
        m, c = windows[row["step"]]
        for comp in row["completions"]:
            assert comp["rewards"]["overlong_penalty"] == pytest.approx(expected(comp["length"], m, c)), row["step"]
            inside += m == 20 and comp["length"] <= 16
    return inside


def test_overlong_window_follows_each_stage_and_a_resume_in_the_middle_of_one(tiny_model_dir, tmp_path):
    over = {
        "reward.functions": "[overlong_penalty]",
        "train.stages": STAGES,
        "train.steps": 3,
        "train.prompts_per_step": 4,
        "record.samples_every": 1,
        "record.samples_prompts": 100,
        "train.save_every": 1,
        "train.keep_checkpoints": 10,
        "data.eval_size": 0,
    }
    ref = tmp_path / "ref"
    make(tiny_model_dir, ref, **over).train()
    # stage 0: max 6, cache round(1.2) = 1 (length 6 scores -1); stage 1: max 20, cache 4 (lengths <= 16 score 0)
    windows = {1: (6, 1), 2: (20, 4), 3: (20, 4)}
    assert check_windows(ref / "samples.jsonl", windows) > 0  # some of stage 1's completions ended in budget
    # killed after step 2 (stage 1's first step) and resumed: step 3 is scored with stage 1's window
    killed = tmp_path / "killed"
    shutil.copytree(ref, killed)
    shutil.rmtree(killed / "checkpoints" / "step-000003")
    for name in ("metrics.jsonl", "samples.jsonl"):
        lines = (killed / name).read_text().splitlines(keepends=True)
        (killed / name).write_text("".join(line for line in lines if json.loads(line)["step"] <= 2))
    (killed / "summary.json").unlink()
    cfg = tiny_cfg(tiny_model_dir, killed, **over)
    cfg.data.dataset = ""
    Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, resume=killed, quiet=True).train()
    steps = [json.loads(line)["step"] for line in (killed / "samples.jsonl").read_text().splitlines()]
    assert 3 in steps
    assert check_windows(killed / "samples.jsonl", windows) > 0


def test_run_values_are_each_stage_s_or_the_run_s():
    cfg = apply_overrides(Config(), ["rollout.max_new_tokens=6", f"train.stages={STAGES[:-1]}, {{steps: 1}}]"])
    assert run_values(cfg, "rollout.max_new_tokens") == [6, 20, 6]
    assert run_values(cfg, "rollout.group_size") == [cfg.rollout.group_size] * 3
    cfg.train.stages = []
    assert run_values(cfg, "rollout.max_new_tokens") == [6]


def test_memory_plan_is_made_for_the_longest_stage(tiny_model_dir, tmp_path, capsys):
    # tiny Llama: 4.5 KiB of activations a token, so 1 MB holds 227 tokens (test_memory.py); 8 rows of
    # 2 prompt tokens + 10 new = 96 fit, but the second stage's 8 x (2 + 40) = 336 do not -> checkpointing
    over = {"train.activation_memory_mb": 1, "rollout.max_new_tokens": 10, "train.steps": 2}
    tr = make(tiny_model_dir, tmp_path / "a", **over)
    assert not tr.memory_plan.checkpointing
    tr = make(
        tiny_model_dir, tmp_path / "b", **over, **{"train.stages": "[{steps: 1}, {steps: 1, max_new_tokens: 40}]"}
    )
    assert tr.memory_plan.checkpointing and "activation checkpointing on" in capsys.readouterr().out


def test_a_domain_s_window_and_its_held_out_grader_follow_the_stage(tiny_model_dir, tmp_path):
    data = tmp_path / "own.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    cfg = apply_overrides(
        Config(),
        [
            f"model.name_or_path={tiny_model_dir}",
            "data.domains.add.task=arithmetic",
            "data.domains.add.eval_size=2",
            f"data.domains.own.dataset={data}",
            f"data.domains.own.eval_dataset={data}",
            "data.domains.own.eval_size=2",
            "data.domains.own.reward_functions=[overlong_penalty, 'helpers.runs:likes_a']",
            "rollout.max_new_tokens=6",
            "train.stages=[{steps: 1}, {steps: 1, max_new_tokens: 20}]",
            f"train.out={tmp_path / 'run'}",
            "record.sinks=[]",
            "record.report=false",
            "train.threads=1",
        ],
    )
    tr = Trainer(cfg, quiet=True)
    own = lambda: {s.name: s.fn for s in tr.runner.specs}["own/overlong_penalty"]
    assert window(own().fn) == (6, 1)  # the run's 6 tokens: cache round(1.2) = 1
    tr._enter_stage()
    assert window(own().fn) == (6, 1) and own().domain == "own"
    tr.step = 1  # the second stage: 20 tokens, cache round(0.2 * 20) = 4
    tr._enter_stage()
    assert window(own().fn) == (20, 4) and own().domain == "own"
    # the own domain has no task: its held-out grader is its first function, now with the stage's window too
    assert window(tr.domain_eval["own"].specs[0].fn) == (20, 4)
    assert tr.domain_eval["add"].specs[0].name == "accuracy"  # the arithmetic task's verifier, kept


def half(completions, **kwargs):
    return [0.5] * len(completions)


def test_functions_a_stage_changes_run_where_they_can_beside_reward_workers(monkeypatch):
    """A stage's new reward function goes through RewardRunner.set_function: a lambda (it cannot be pickled)
    runs in the trainer process, not in the worker pool. Before, the stage wrote runner.specs directly and the
    pool was sent the lambda, which failed every call (the failure value 0, not 3)."""
    from grpokit.rewards import RewardRunner, RewardSpec
    from grpokit.train import domain_setup
    from grpokit.train.trainer_stages import TrainerStages

    def three(completions, **kwargs):
        return [3.0] * len(completions)

    monkeypatch.setattr(domain_setup, "follow_settings", lambda cfg, specs: [s.__class__(three, s.name) for s in specs])
    trainer = TrainerStages()
    trainer.cfg = None
    trainer.runner = RewardRunner([RewardSpec(half, "h")], num_workers=1, max_failure_fraction=1.0)
    trainer.domain_graders = {"d": "h"}  # a domain's held-out grader is the training column "h"'s function
    trainer.domain_eval = {"d": RewardRunner([RewardSpec(half, "d")], num_workers=1, max_failure_fraction=1.0)}
    batch = dict(prompts=["p", "p"], completions=["a", "b"], completion_ids=[[1], [1]], group_size=2)
    with trainer.runner, trainer.domain_eval["d"]:
        assert trainer.runner.score(**batch).total_N.tolist() == [0.5, 0.5]  # half in the worker
        trainer._follow_rewards([2.0])  # the stage: weight 2, function three
        assert trainer.runner.score(**batch).total_N.tolist() == [6.0, 6.0]  # 2 * 3.0, in this process
        assert trainer.domain_eval["d"].score(**batch).total_N.tolist() == [3.0, 3.0]  # the grader follows it
    assert trainer.runner.specs[0].name == "h" and trainer.runner_weights == [2.0]
