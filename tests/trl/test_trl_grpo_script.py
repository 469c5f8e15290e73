"""TRL's own example script (trl/scripts/grpo.py) runs on grpokit's GRPOTrainer, and ``train()``
returns what transformers' Trainer returns.

The script is not copied: its untouched ``main()`` is called with ``trl.GRPOTrainer`` replaced by
grpokit's (the one-import change, made on the module instead of in the file) and grpokit's
GRPOConfig as ``training_args``. Its dataset is a local folder of train/test JSON lines (the
script's ``load_dataset(dataset_name)`` reads a folder as it reads a hub id), its model the tiny
local chat model, its hub the fake one on 127.0.0.1. What it calls on the trainer: ``train``,
``accelerator.print``, ``save_model``, ``push_to_hub``, ``hub_model_id`` and ``end``. The script's
command-line parser (TrlParser building trl's own GRPOConfig) is not exercised here.
"""

from __future__ import annotations

import json
import math

import pytest

from grpokit.trl import GRPOConfig, GRPOTrainer
from grpokit.trl.log_history import final_entry
from grpokit.trl.trainer import Accelerator
from helpers.trl_models import FakeHub, small_args


def write_split(folder, name, n):
    rows = [{"prompt": [{"role": "user", "content": f"add {a} and 1"}], "solution": str(a + 1)} for a in range(n)]
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_trls_grpo_script_main_runs_on_grpokits_trainer(chat_model, tmp_path, monkeypatch, capsys):
    trl = pytest.importorskip("trl")
    from trl.scripts.grpo import GRPOScriptArguments, main

    from trl import DatasetMixtureConfig, ModelConfig

    data = tmp_path / "data"
    data.mkdir()
    write_split(data, "train", 8)
    write_split(data, "test", 2)
    (tmp_path / "my_rewards_grpo_script.py").write_text(
        "def short(completions, **kw):\n    return [-len(c[0]['content']) / 10 for c in completions]\n"
    )
    monkeypatch.chdir(tmp_path)  # the script imports dotted reward paths from the working directory
    made = []
    monkeypatch.setattr(trl, "GRPOTrainer", lambda **kw: made.append(GRPOTrainer(**kw)) or made[-1])
    out = tmp_path / "run"
    script_args = GRPOScriptArguments(
        dataset_name=str(data), reward_funcs=["think_format_reward", "accuracy_reward", "my_rewards_grpo_script.short"]
    )
    training_args = small_args(
        GRPOConfig,
        out,
        max_steps=2,
        eval_strategy="steps",
        eval_steps=1,
        push_to_hub=True,
        hub_model_id="me/tiny-grpo",
        hub_strategy="end",
    )
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        main(script_args, training_args, ModelConfig(model_name_or_path=str(chat_model)), DatasetMixtureConfig())
    trainer = made[0]
    printed = capsys.readouterr().out
    assert "Training completed." in printed and f"Model saved to {out}." in printed and "me/tiny-grpo" in printed
    assert trainer.state.global_step == 2
    assert [s.name for s in trainer._trainer.runner.specs] == ["think_format_reward", "accuracy_reward", "short"]
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]  # the test split became the eval_dataset
    assert [h["step"] for h in evals] == [1, 2] and all("eval_rewards/accuracy_reward/mean" in h for h in evals)
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()  # save_model(output_dir)
    assert "model.safetensors" in hub.repos["me/tiny-grpo"]  # push_to_hub(dataset_name=...)
    assert trainer.model.dtype.is_floating_point and str(trainer.model.dtype) == "torch.float32"  # ModelConfig.dtype


def test_accelerator_reports_this_process_and_prints_on_the_main_one_only(monkeypatch, capsys):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    acc = Accelerator()
    assert (acc.process_index, acc.num_processes, acc.is_main_process, acc.is_local_main_process) == (0, 1, True, True)
    acc.print("hello")
    acc.wait_for_everyone()  # one process: nothing to wait for
    assert capsys.readouterr().out == "hello\n"
    monkeypatch.setenv("RANK", "3")  # the second process of the second node under torchrun
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert (acc.process_index, acc.local_process_index, acc.num_processes, acc.is_main_process) == (3, 1, 4, False)
    acc.print("hello")
    assert capsys.readouterr().out == ""


def test_final_entry_is_trls():
    # 2 steps of 8 completions in 4 s: 16 / 4 = 4 samples/s, 2 / 4 = 0.5 steps/s; loss mean (0.5 + 1.5) / 2 = 1
    assert final_entry(2, [0.5, 1.5], 4.0, 8) == {
        "train_runtime": 4.0,
        "train_samples_per_second": 4.0,
        "train_steps_per_second": 0.5,
        "total_flos": 0.0,
        "train_loss": 1.0,
    }


def test_a_later_update_of_a_round_logs_only_its_own_metrics():
    # a round of 2 updates logged every step, driven by the loop's events: step 1 (ended when update 2 begins) logs
    # the round's sampling metrics (reward) with update 1's own; step 2 (ended by the round's end) update 2's own and
    # the round's own time/step. The loop's line (its mean over the updates: loss 9.0, clip ratios) adds none of it
    from types import SimpleNamespace

    from grpokit.train.callbacks import Control
    from grpokit.trl.bridge import StepBridge
    from grpokit.trl.default_callbacks import DefaultFlowCallback

    bridge = StepBridge(GRPOConfig("o", logging_steps=1, max_steps=2), [DefaultFlowCallback()], 2, dict, print, {})
    state, control = SimpleNamespace(epoch=0.0), Control()
    # the update's own clip ratios: the means and TRL's per-sequence extremes (algo/loss.py), passed through
    update = {
        "loss": 2.0,
        "clip_ratio/low_mean": 0.25,
        "clip_ratio/high_mean": 0.125,
        "clip_ratio/low_min": 0.0,
        "clip_ratio/high_max": 0.5,
    }
    bridge.on_step_begin(None, state, control)
    bridge.sampled_round({"reward": 0.5})
    bridge.on_update_begin(None, state, control)
    bridge.on_optimizer_step(None, state, control, metrics=update)
    bridge.on_update_begin(None, state, control)  # step 1 ends
    bridge.on_optimizer_step(None, state, control, metrics={**update, "loss": 4.0})
    line = {"reward": 0.5, "loss": 9.0, "clip_ratio/low_mean": 0.1, "clip_ratio/high_mean": 0.3, "time/step": 3.0}
    bridge.on_step_end(None, state, control, metrics=line)  # the round ends: step 2 ends
    first, second = bridge.state.log_history[:2]
    assert (first["step"], first["reward"], first["loss"], "time/step" in first) == (1, 0.5, 2.0, False)
    assert (first["clip_ratio/low_min"], first["clip_ratio/high_max"]) == (0.0, 0.5)  # not the means
    assert (second["step"], "reward" in second, second["loss"], second["time/step"]) == (2, False, 4.0, 3.0)
    assert (second["clip_ratio/low_mean"], second["clip_ratio/high_mean"]) == (0.25, 0.125)  # the update's own
    assert first["step_time"] >= 0.0 and second["step_time"] >= 0.0


def test_train_returns_trainoutput_and_log_history_carries_epoch(chat_model, tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh")]
    from datasets import Dataset

    args = small_args(GRPOConfig, tmp_path / "run", max_steps=2, num_generations=2, logging_steps=1)
    tr = GRPOTrainer(
        str(chat_model),
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        train_dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(rows[:1]),
        args=args,
    )
    res = tr.train()
    # 4 completions / 2 per prompt = 2 prompts a step over 4 rows: epoch 0.5 after step 1, 1.0 after step 2;
    # then TRL's final entry
    assert [(h["step"], h["epoch"]) for h in tr.state.log_history] == [(1, 0.5), (2, 1.0), (2, 1.0)]
    assert res.global_step == 2 and res.metrics["epoch"] == 1.0
    losses = [h["loss"] for h in tr.state.log_history if "loss" in h]
    assert len(losses) == 2 and res.training_loss == pytest.approx(sum(losses) / 2) == res.metrics["train_loss"]
    assert res.metrics["train_runtime"] > 0 and res.metrics["total_flos"] == 0.0
    assert res.metrics["train_samples_per_second"] == pytest.approx(8 / res.metrics["train_runtime"], rel=1e-2)
    assert tr.state.log_history[-1] == {**{k: v for k, v in res.metrics.items()}, "step": 2}
    ev = tr.evaluate()  # on demand after training: 1 prompt x 2 generations, TRL's names
    assert {
        "eval_loss",
        "eval_reward",
        "eval_rewards/<lambda>/mean",
        "eval_runtime",
        "eval_num_tokens",
        "epoch",
    } <= set(ev)
    assert ev["eval_reward"] == 0.0 and tr.state.log_history[-1]["eval_loss"] == ev["eval_loss"]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_attn_implementation_reaches_from_pretrained(chat_model, tmp_path, attn):
    from datasets import Dataset

    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        use_cpu=True,
        model_init_kwargs={"attn_implementation": attn, "dtype": "bfloat16"},
    )
    tr = GRPOTrainer(
        str(chat_model),
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        train_dataset=Dataset.from_list([{"prompt": "1+1="}]),
        args=args,
    )
    assert tr.model.config._attn_implementation == attn and str(tr.model.dtype) == "torch.bfloat16"


def test_attn_implementation_is_refused_for_a_model_object_and_checked_by_name(chat_model):
    from transformers import AutoModelForCausalLM

    from grpokit.config import Config, ConfigError
    from grpokit.config.io import set_field
    from grpokit.train.models import load_model
    from grpokit.validation import validate

    cfg = Config()
    set_field(cfg, "model.attn_implementation", "eager")
    with pytest.raises(ConfigError, match=r"^model.attn_implementation='eager' is chosen when loading"):
        load_model(
            cfg.model,
            __import__("torch").device("cpu"),
            __import__("torch").float32,
            model=AutoModelForCausalLM.from_pretrained(chat_model),
        )
    set_field(cfg, "model.attn_implementation", "fast")
    with pytest.raises(
        ConfigError, match=r"model.attn_implementation='fast' is not valid; choose one of: auto, eager, sdpa"
    ):
        validate(cfg)


def test_take_means_by_hand():
    # TRL's log: reward [1, 2] -> 1.5, an empty list is left out, and the same dict is cleared (a subclass may
    # hold _metrics["train"]); bridge.take_metrics, on_train_end and GRPOTrainer.log all take them so
    from grpokit.trl.log_history import take_means

    metrics = {"reward": [1.0, 2.0], "kl": []}
    assert take_means(metrics) == {"reward": 1.5} and metrics == {}
    # a step whose rewards were all None logged NaN: TRL 1.16 leaves it out of the window's mean, None when no
    # value is left (a plain mean made the whole window NaN)
    assert take_means({"reward": [float("nan"), 1.0], "none": [float("nan")]}) == {"reward": 1.0, "none": None}


def test_log_history_values_by_hand():
    # transformers' own values of an entry: the window's mean loss (1 + 3) / 2 = 2, the last learning_rate; a NaN
    # step loss after [1, 3] counts as (1 + 3) / (2 + 1) = 4/3 (logging_nan_inf_filter), as is without the filter
    from grpokit.trl.log_history import add_values, filtered_loss, own_entry

    own, pending = {}, {}
    add_values({"loss": 1.0, "learning_rate": 0.2, "reward": 0.5, "num_tokens": 10.0, "name": "x"}, own, pending)
    add_values({"loss": 3.0, "learning_rate": 0.1, "reward": 1.5, "num_tokens": 30.0}, own, pending)
    assert own_entry(own) == {"loss": 2.0, "learning_rate": 0.1}
    assert pending == {"reward": [0.5, 1.5], "num_tokens": [30.0]}  # a running total: its latest value only
    assert filtered_loss(float("nan"), [1.0, 3.0], True) == pytest.approx(4 / 3)
    assert filtered_loss(2.5, [1.0, 3.0], True) == 2.5 and math.isnan(filtered_loss(float("nan"), [1.0], False))


@pytest.mark.parametrize(
    "value, period, state_period",
    [
        (0.25, 3, 3),  # ceil(10 * 0.25) = ceil(2.5) = 3
        (4, 4, 4),
        (-0.25, 2, -2),  # transformers' negative period ceil(-2.5) = -2: its size 2, TrainerState's -2
        (0, 0, 1),  # TrainerState's logging / eval period: every step
        (None, 500, 500),  # transformers' default
    ],
)
def test_every_steps_on_a_10_step_run(value, period, state_period):
    from grpokit.trl.args.rule import every_steps

    assert (every_steps(value, 10), every_steps(value, 10, state=True)) == (period, state_period)
