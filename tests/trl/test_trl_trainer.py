"""The TRL layer's trainer and what came with it: callbacks at their points, reward weights on
callables, log_extra, reward models by folder, LoRA refusals, push_to_hub against a fake Hub on
127.0.0.1, TRL-style YAML for ``grpokit train``."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset

from grpokit.config import ConfigError
from grpokit.trl import GRPOConfig, GRPOTrainer
from helpers.runs import ROWS, likes_a, tiny_cfg
from helpers.trl_models import FakeHub, save_tiny_reward_model, small_args


def short(completions, **kwargs):
    return [-len(c[0]["content"] if isinstance(c, list) else c) / 10 for c in completions]


def tags_lengths(completions, log_extra, **kwargs):
    log_extra("chars", [len(c[0]["content"]) for c in completions])
    return [0.0] * len(completions)


def args(out, **kw):
    return small_args(GRPOConfig, out, **{"max_steps": 2, **kw})


DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}], "word": w} for w in ("ab", "cd", "ef")])


class Recorder:
    """A TrainerCallback-shaped object that records which event came when."""

    def __init__(self, stop_at=None):
        self.events, self.stop_at = [], stop_at

    def on_train_begin(self, args, state, control, **kw):
        self.events.append(("begin", state.global_step))

    def on_step_end(self, args, state, control, **kw):
        self.events.append(("step_end", state.global_step))
        if state.global_step == self.stop_at:
            control.should_training_stop = True

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        self.events.append(("evaluate", state.global_step, sorted(metrics)[:1]))

    def on_log(self, args, state, control, logs=None, **kw):
        self.events.append(("log", state.global_step, "reward" in logs))

    def on_save(self, args, state, control, checkpoint=None, **kw):
        self.events.append(("save", state.global_step, checkpoint.name))

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kw):
        self.events.append(("end", state.global_step, model is not None and processing_class is not None))


def test_callbacks_are_called_at_their_points_and_can_stop_the_run(tiny_model_dir, tmp_path):
    from grpokit.train import Trainer

    cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{"train.steps": 3, "train.save_every": 1})
    cfg.data.dataset = ""
    rec = Recorder(stop_at=2)
    summary = Trainer(
        cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=ROWS[:2], quiet=True, callbacks=[rec]
    ).train()
    assert rec.events == [
        ("begin", 0),
        ("evaluate", 0, ["eval_accuracy"]),
        ("step_end", 1),
        ("log", 1, True),
        ("save", 1, "step-000001"),
        ("step_end", 2),
        ("evaluate", 2, ["eval_accuracy"]),
        ("log", 2, True),
        ("save", 2, "step-000002"),
        ("end", 2, True),
    ]
    assert summary["steps"] == 2  # stopped after step 2 of 3, with its checkpoint and final evaluation
    cfg.train.out = str(tmp_path / "run2")  # a new run: the first one holds "run"
    with pytest.raises(TypeError, match="none of the methods"):
        Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, quiet=True, callbacks=[object()])


def test_reward_weights_weight_callables_and_a_wrong_count_is_one_sentence(tiny_model_dir, tmp_path):
    from grpokit.train import Trainer

    cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{"reward.weights": "[2.0, 0.5]"})
    cfg.data.dataset = ""
    tr = Trainer(cfg, reward_funcs=[likes_a, short], train_rows=ROWS, quiet=True)
    assert [(s.name, s.weight) for s in tr.runner.specs] == [("likes_a", 2.0), ("short", 0.5)]
    cfg.reward.weights = [1.0, 2.0, 3.0]
    cfg.train.out = str(tmp_path / "run2")  # a new run: the first one holds "run"
    with pytest.raises(ConfigError, match="reward.weights has 3 entries but there are 2 reward functions"):
        Trainer(cfg, reward_funcs=[likes_a, short], train_rows=ROWS, quiet=True)


def test_log_extra_values_sit_beside_their_completions_in_samples(chat_model, tmp_path):
    tr = GRPOTrainer(
        str(chat_model),
        reward_funcs=[short, tags_lengths],
        train_dataset=DATA,
        args=args(tmp_path / "run", log_completions=True, logging_steps=1),
    )
    tr.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    comp = rows[0]["completions"][0]
    assert comp["extra"]["chars"] == len(comp["text"])  # each value beside its own completion


def test_reward_model_given_by_folder_scores_the_conversation(chat_model, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_model)
    rm = save_tiny_reward_model(tmp_path / "rm", tok)
    tr = GRPOTrainer(
        str(chat_model),
        reward_funcs=[str(tmp_path / "rm")],
        train_dataset=DATA,
        args=args(tmp_path / "run", max_steps=1),
    )
    fn = tr.reward_funcs[0]
    assert fn.__name__ == "rm"
    prompt, comp = [{"role": "user", "content": "say ab"}], [{"role": "assistant", "content": "ab"}]
    text = tok.apply_chat_template(prompt + comp, tokenize=False)  # TRL scores the templated conversation
    with torch.no_grad():
        expected = rm(**tok([text], return_tensors="pt")).logits[0, 0].item()
    assert fn([prompt], [comp]) == [pytest.approx(expected, abs=1e-5)]
    tr.train()
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "rewards/rm/mean" in metrics


def test_lora_settings_grpokit_cannot_carry_out_are_refused(chat_model, tmp_path):
    from peft import LoraConfig

    for cfg, name in [(LoraConfig(r=4, use_dora=True), "use_dora"), (LoraConfig(r=4, bias="all"), "bias")]:
        with pytest.raises(ConfigError, match=f"peft_config.{name}="):
            GRPOTrainer(str(chat_model), reward_funcs=[short], train_dataset=DATA, args=args(tmp_path), peft_config=cfg)
    with pytest.raises(ConfigError, match="reward_weights has 2 entries but there are 1 reward functions"):
        GRPOTrainer(
            str(chat_model), reward_funcs=[short], train_dataset=DATA, args=args(tmp_path, reward_weights=[1, 2])
        )
    with pytest.raises(ConfigError, match="no 'prompt' column"):
        GRPOTrainer(
            str(chat_model), reward_funcs=[short], train_dataset=Dataset.from_list([{"q": "x"}]), args=args(tmp_path)
        )


def test_model_and_tokenizer_objects_are_trained_as_given(chat_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(chat_model), AutoTokenizer.from_pretrained(chat_model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    tr = GRPOTrainer(
        model,
        reward_funcs=[short],
        train_dataset=DATA,
        processing_class=tok,
        args=args(tmp_path / "run", learning_rate=1e-2),
    )
    tr.train()
    assert tr.model is model and tr.processing_class is tok
    assert any(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters())


def test_push_to_hub_uploads_the_model_and_its_card_to_a_fake_hub(chat_model, tmp_path, monkeypatch):
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        tr = GRPOTrainer(
            str(chat_model),
            reward_funcs=[short],
            train_dataset=DATA,
            args=args(tmp_path / "run", push_to_hub=True, hub_model_id="me/tiny-grpo", save_steps=1),
        )
        tr.train()
    files = hub.repos["me/tiny-grpo"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(files)
    assert files["model.safetensors"] == (tmp_path / "run" / "model.safetensors").read_bytes()
    assert b"grpokit" in files["README.md"]
    assert b"\nmodel_name: tiny-grpo\n" in files["README.md"]  # push_to_hub's create_model_card, TRL's model_name
    # hub_strategy every_save: each checkpoint (steps 1 and 2), then the final model
    assert [m for _, m in hub.commits] == [
        "Training in progress, step 1",
        "Training in progress, step 2",
        "End of training",
    ]


def test_grpokit_train_reads_a_trl_style_yaml(chat_model, tmp_path, monkeypatch):
    from grpokit.cli import main

    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{a}+{a}=", "solution": str(2 * a)}) for a in range(6)))
    (tmp_path / "my_rewards.py").write_text(
        "def exact(completions, solution, **kw):\n"
        "    return [float(c.strip() == s) for c, s in zip(completions, solution)]\n"
    )
    cfg = tmp_path / "trl.yaml"
    cfg.write_text(
        f"model_name_or_path: {chat_model}\ndataset_name: {data}\nreward_funcs: [my_rewards.exact]\n"
        "num_generations: 2\nper_device_train_batch_size: 4\nmax_completion_length: 4\nmax_steps: 1\n"
        "use_cpu: true\nuse_peft: true\nlora_r: 2\nlora_target_modules: [q_proj]\n"
    )
    monkeypatch.chdir(tmp_path)  # the reward module is found in the working directory, as TRL's CLI finds it
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run"), "learning_rate=1e-4"]) == 0
    saved = __import__("yaml").safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"]["lora_rank"] == 2 and saved["optim"]["lr"] == 1e-4 and saved["train"]["prompts_per_step"] == 2
    assert (tmp_path / "run" / "adapter_model.safetensors").exists()
    cfg.write_text(cfg.read_text() + "use_dora: true\n")
    assert main(["train", "--config", str(cfg)]) == 2  # one sentence, exit status 2


def test_a_trainer_callback_subclass_gets_step_begin_and_an_event_grpokit_never_calls_is_refused(chat_model, tmp_path):
    from transformers import TrainerCallback

    class Steps(TrainerCallback):  # inherits transformers' no-op on_epoch_end, on_optimizer_step ...: accepted
        def __init__(self):
            self.seen = []

        def on_step_begin(self, args, state, control, **kw):
            self.seen.append(("begin", state.global_step))

        def on_step_end(self, args, state, control, **kw):
            self.seen.append(("end", state.global_step))

    cb = Steps()
    GRPOTrainer(
        str(chat_model), reward_funcs=[short], train_dataset=DATA, args=args(tmp_path / "run"), callbacks=[cb]
    ).train()
    assert cb.seen == [("begin", 0), ("end", 1), ("begin", 1), ("end", 2)]  # global_step before and after each step

    class Predicts(TrainerCallback):  # on_predict: transformers' predict(), which grpokit.trl does not have
        def on_predict(self, args, state, control, metrics, **kw):
            raise AssertionError("never reached")

    tr = GRPOTrainer(
        str(chat_model), reward_funcs=[short], train_dataset=DATA, args=args(tmp_path / "run2"), callbacks=[Predicts]
    )
    with pytest.raises(
        TypeError, match=r"^callback Predicts defines on_predict, which grpokit never calls; move that code"
    ):
        tr.train()


def test_streamed_train_data_an_eval_datasetdict_and_reward_processing_classes(chat_model, tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh")]
    stream = Dataset.from_list(rows).to_iterable_dataset()  # TRL accepts a stream with max_steps
    from datasets import DatasetDict

    evals = DatasetDict({"a": Dataset.from_list(rows[:1]), "b": Dataset.from_list(rows[1:2])})
    tr = GRPOTrainer(
        str(chat_model),
        reward_funcs=[short],
        args=args(tmp_path / "run", num_iterations=2, logging_steps=1),
        train_dataset=stream,
        eval_dataset=evals,
        reward_processing_classes=[None],
    )
    # max_steps=2 at num_iterations=2 is one sampling round of 4 completions / G=4 = 1 prompt: 1 row read
    assert len(tr._kwargs["train_rows"]) == 1
    res = tr.train()
    assert res.global_step == 2 and [h["step"] for h in tr.state.log_history] == [
        1,
        2,
        2,
    ]  # two updates, then the final entry
    ev = tr.evaluate()
    assert {"eval_a_loss", "eval_a_reward", "eval_b_loss", "eval_b_rewards/short/mean"} <= set(ev)
    with pytest.raises(ConfigError, match=r"^reward_processing_classes has 2 entries but there are 1 reward functions"):
        GRPOTrainer(
            str(chat_model),
            reward_funcs=[short],
            args=args(tmp_path / "x"),
            train_dataset=Dataset.from_list(rows),
            reward_processing_classes=[None, None],
        )


def test_max_steps_inside_a_generation_batch_ends_at_trls_step(chat_model, tmp_path):
    # num_iterations 2: each generation batch feeds 2 steps, so max_steps 3 ends after the second batch's
    # first update, as TRL's loop does (it stops at global_step == max_steps); grpokit used to finish the
    # batch and end at step 4
    from grpokit.trl.mapping import to_config

    a = args(tmp_path / "run", num_iterations=2, max_steps=3, logging_steps=1)
    cfg = to_config(a, num_rows=len(DATA))
    assert (cfg.train.steps, cfg.train.max_updates) == (2, 3)

    class Ends:
        steps: list[int] = []

        def on_step_end(self, args, state, control, **kw):
            self.steps.append(state.global_step)

    ends = Ends()
    tr = GRPOTrainer(str(chat_model), reward_funcs=[short], args=a, train_dataset=DATA, callbacks=[ends])
    tr.train()
    assert tr.state.global_step == 3 and ends.steps == [1, 2, 3]
    assert [h["step"] for h in tr.state.log_history if "loss" in h] == [1, 2, 3]


def test_the_rolling_window_closes_each_epoch_as_transformers(chat_model, tmp_path):
    # TRL's test_prepare_input_called_with_correct_data's arguments: 12 prompts, generation batches of 6 prompts
    # x 4 = 24 completions cut into 4 slices, 2 iterations: 16 micro-steps an epoch, 3 a step, so transformers
    # makes ceil(16 / 3) = 6 steps an epoch (the 6th of 1 micro-step), 18 in 3 epochs. Measured under trl 1.16 with
    # that test: global_step 18. grpokit carried the window across epochs before: 15.
    from grpokit.trl.mapping import to_config

    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}], "word": w} for w in "abcdefghijkl"])
    a = args(
        tmp_path / "run",
        max_steps=-1,
        num_train_epochs=3,
        per_device_train_batch_size=6,
        num_generations=4,
        gradient_accumulation_steps=3,
        steps_per_generation=4,
        num_iterations=2,
        shuffle_dataset=False,
    )
    t = to_config(a, num_rows=12).train
    assert (t.steps, t.updates_per_batch, t.accumulation_slices, t.accumulation_epoch_steps, t.max_updates) == (
        6,
        4,
        3,
        2,
        18,
    )
    tr = GRPOTrainer(str(chat_model), reward_funcs=[short], args=a, train_dataset=rows)
    tr.train()
    assert tr.state.global_step == 18 and tr.state.epoch == 3.0
