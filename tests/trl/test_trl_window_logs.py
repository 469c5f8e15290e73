"""The logged loss of TRL's rolling window (steps_per_generation not a multiple of gradient_accumulation_steps):
each TRL step's entry holds its own update's loss, once, whatever round its update ended in.

With steps_per_generation 3 and gradient_accumulation_steps 2 the updates are A0 A1 | A2 B0 | B1 B2 | ...: round A
applies update 1 and ends while update 2 (A2 ...) is still accumulating, so its step (1) has ended already at A2's
start. Round A's own metrics (timings ...) then wait for step 2's entry; the loop's line for round A also holds
the mean of its updates (update 1's loss), which step 1 logged: before, that joined step 2's entry too, so step 2
logged the mean of updates 1 and 2 and train_loss counted update 1 twice (TRL 1.16: -0.34073 and -0.19870,
grpokit.trl: -0.24608 and -0.18925 on the run below).
"""

from __future__ import annotations

import types

import pytest
from datasets import Dataset

from grpokit.train.callbacks import Control
from grpokit.trl.bridge import StepBridge
from grpokit.trl.config import GRPOConfig
from grpokit.trl.default_callbacks import DefaultFlowCallback


def test_a_round_whose_last_step_ended_passes_on_only_its_own_metrics():
    # the loop's events for A0 A1 | A2 B0 | B1 B2 |, losses -0.1, -0.3, -0.2 (logging every step):
    # step 1 = -0.1, step 2 = -0.3 (not (-0.1 - 0.3) / 2 = -0.2), step 3 = -0.2, train_loss = -0.6 / 3 = -0.2
    # (not -0.7 / 4 = -0.175); round A's time/step (1.0) joins step 2's entry, round B's (2.0) step 3's
    bridge = StepBridge(GRPOConfig("o", logging_steps=1, max_steps=3), [DefaultFlowCallback()], 3, dict, print, {})
    state, control = types.SimpleNamespace(epoch=0.0), Control()

    def update(loss):
        bridge.on_optimizer_step(None, state, control, metrics={"loss": loss, "grad_norm": -loss})

    bridge.on_step_begin(None, state, control)  # round A
    bridge.sampled_round({"reward": 0.5})
    bridge.on_update_begin(None, state, control)
    update(-0.1)
    bridge.on_update_begin(None, state, control)  # A2 begins update 2: step 1 ends
    line = {"reward": 0.5, "loss": -0.1, "grad_norm": 0.1, "grad_norm/max": 0.1, "time/step": 1.0}
    bridge.on_step_end(None, state, control, metrics=line)  # the loop's line of round A: update 1's mean
    bridge.on_step_begin(None, state, control)  # round B: B0 completes update 2
    bridge.sampled_round({"reward": 0.7})
    update(-0.3)
    bridge.on_update_begin(None, state, control)  # B1: step 2 ends
    update(-0.2)
    line = {"reward": 0.7, "loss": -0.25, "grad_norm": 0.25, "grad_norm/max": 0.3, "time/step": 2.0}
    bridge.on_step_end(None, state, control, metrics=line)
    bridge.on_train_end(None, state, control)
    entries = bridge.state.log_history
    assert [(e["step"], e["loss"], e.get("time/step")) for e in entries[:3]] == [
        (1, -0.1, None),
        (2, -0.3, 1.0),
        (3, -0.2, 2.0),
    ]
    assert entries[1]["grad_norm"] == 0.3 and "grad_norm/max" not in entries[1]
    assert entries[-1]["train_loss"] == pytest.approx(-0.2)


LENGTHS = [1, 3, 6, 8, 2, 8, 5, 4, 7, 3, 1, 6, 8, 8, 2, 5]


def fixed_completions(tokenizer):
    """A rollout_func whose completions depend only on the call and the row: both libraries train on the same."""
    calls = [0]

    def rollout(prompts, trainer):
        c, calls[0] = calls[0], calls[0] + 1
        prompt_ids, completion_ids = [], []
        for i, p in enumerate(prompts):
            text = tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            prompt_ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
            n = LENGTHS[(i + 3 * c) % len(LENGTHS)]
            ids = [2 + ((i * 7 + j * 3 + c) % 30) for j in range(n)]
            if n < 8 and (i + c) % 2 == 0:
                ids[-1] = tokenizer.eos_token_id
            completion_ids.append(ids)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": [[0.0] * len(x) for x in completion_ids],
        }

    return rollout


def length_reward(completions, **kwargs):
    return [len(c[0]["content"]) / 10 + ("d" in c[0]["content"]) for c in completions]


def window_run(lib: str, model: str, out, monkeypatch) -> list[dict]:
    import importlib

    from transformers import AutoTokenizer

    mod = importlib.import_module(lib)
    if lib == "trl":  # TRL shuffles a generation batch before cutting it; grpokit cuts in row order
        import trl.trainer.grpo_trainer as grpo

        monkeypatch.setattr(grpo, "shuffle_sequence_dict", lambda d: d)
    args = mod.GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=2, num_generations=2, steps_per_generation=3,
        gradient_accumulation_steps=2, max_steps=4, max_completion_length=8, learning_rate=0.3, epsilon=0.1,
        optim="sgd", max_grad_norm=0.0, bf16=False, use_cpu=True, gradient_checkpointing=False, disable_tqdm=True,
        report_to=[], logging_steps=1, save_strategy="no", seed=0,
    )  # fmt: skip
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "add 1 and 2"}]}] * 16)
    rollout = fixed_completions(AutoTokenizer.from_pretrained(model))
    trainer = mod.GRPOTrainer(model, reward_funcs=[length_reward], args=args, train_dataset=rows, rollout_func=rollout)
    trainer.train()
    return trainer.state.log_history


def test_the_rolling_windows_logged_losses_are_trls(chat_model, tmp_path, monkeypatch):
    pytest.importorskip("trl")
    ours = window_run("grpokit.trl", chat_model, tmp_path / "grpokit", monkeypatch)
    theirs = window_run("trl", chat_model, tmp_path / "trl", monkeypatch)
    losses = [[e["loss"] for e in log if "loss" in e] for log in (ours, theirs)]
    assert len(losses[0]) == 4 and losses[0] == pytest.approx(losses[1], rel=1e-4, abs=1e-6)
    assert ours[-1]["train_loss"] == pytest.approx(theirs[-1]["train_loss"], rel=1e-4, abs=1e-6)
