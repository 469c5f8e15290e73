"""Data and reward returns at grpokit.trl's door as TRL meets them: a prompt that is no text or conversation is
refused (TRL's tokenizer raises; grpokit trained the text "None"), a reward function's wrong count stops the
run (TRL raises; grpokit re-called it once per completion), any iterable of rewards is taken (numpy, torch, a
generator: TRL iterates them), what reward functions log is reported by evaluate() too, and a streamed
train_dataset's epoch is transformers' (max_steps is one epoch). Where a run is cheap the same test body runs
under ``trl`` (the oracle), so the expectation is TRL's."""

from __future__ import annotations

import importlib
import sys

import pytest
from datasets import Dataset

from grpokit.config import ConfigError
from helpers.trl_models import small_args

BACKENDS = ["grpokit.trl", pytest.param("trl", marks=pytest.mark.slow)]
ROWS = [{"prompt": f"q{i} ", "idx": i} for i in range(8)]


def small(module, out, **kw):
    base = dict(max_steps=2, num_generations=2, report_to="none", logging_steps=1, save_strategy="no")
    return small_args(module.GRPOConfig, out, **{**base, **kw})


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_missing_prompt_is_refused_not_trained_as_none(backend, chat_model, tmp_path):
    mod = importlib.import_module(backend)
    rows = [dict(r) for r in ROWS]
    rows[0]["prompt"] = None  # a jsonl row without its prompt: datasets fills None
    with pytest.raises(Exception) as e:  # TRL: its tokenizer refuses None during train()
        mod.GRPOTrainer(
            chat_model, reward_funcs=length, args=small(mod, tmp_path), train_dataset=Dataset.from_list(rows)
        ).train()
    if backend == "grpokit.trl":  # before: trained on the text "None"
        assert isinstance(e.value, ConfigError)
        assert str(e.value).startswith("train_dataset[0] has no value in the prompt column 'prompt'")


def test_stream_and_eval_rows_are_checked_as_they_arrive(chat_model, tmp_path):
    from grpokit.trl import GRPOConfig, GRPOTrainer

    stream = Dataset.from_list([{"prompt": f"q{i} "} for i in range(40)]).to_iterable_dataset()
    stream = stream.map(lambda r, i: {"prompt": 7} if i == 3 else r, with_indices=True)
    # max_steps 4 of one prompt each reads rows 0..3: row 3 is refused as it arrives
    with pytest.raises(ConfigError, match=r"^train_dataset\[3\] has a prompt of type int \(7\) in column 'prompt'"):
        GRPOTrainer(
            chat_model, reward_funcs=length, args=small_args(GRPOConfig, tmp_path, max_steps=4), train_dataset=stream
        )
    trainer = GRPOTrainer(
        chat_model,
        reward_funcs=length,
        args=small_args(GRPOConfig, tmp_path, max_steps=1),
        train_dataset=Dataset.from_list(ROWS),
    )
    bad_eval = [{"prompt": "a"}, {"prompt": [{"role": "user"}, "b"]}]  # row dicts: arrow cannot hold the mixed types
    with pytest.raises(
        ConfigError, match=r"^eval_dataset\[1\] has a prompt \(column 'prompt'\) that is a list holding 'b'"
    ):
        trainer.evaluate(bad_eval)


def per_prompt(prompts, completions, **kwargs):
    return [float(len(p)) for p in dict.fromkeys(prompts)]  # one per prompt, not per completion


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reward_functions_wrong_count_stops_the_run(backend, chat_model, tmp_path):
    mod = importlib.import_module(backend)
    trainer = mod.GRPOTrainer(
        chat_model, reward_funcs=per_prompt, args=small(mod, tmp_path), train_dataset=Dataset.from_list(ROWS)
    )
    # one batch: 2 prompts x 2 completions; the function returns 2 values for the 4 (before: re-called per completion)
    want = (
        "returned 2 rewards, but 4 were expected" if backend == "trl" else "Reward 'per_prompt' returned 2 values for 4"
    )
    with pytest.raises(Exception, match=want):
        trainer.train()


def numpy_length(completions, **kwargs):
    import numpy as np

    return np.array([float(len(c)) for c in completions])


def tensor_length(completions, **kwargs):
    import torch

    return torch.tensor([float(len(c)) for c in completions])


def generated_length(completions, **kwargs):
    return (float(len(c)) for c in completions)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rewards_as_numpy_torch_or_a_generator_train(backend, chat_model, tmp_path):
    mod = importlib.import_module(backend)
    funcs = [numpy_length, tensor_length, generated_length]
    trainer = mod.GRPOTrainer(
        chat_model, reward_funcs=funcs, args=small(mod, tmp_path, max_steps=1), train_dataset=Dataset.from_list(ROWS)
    )
    trainer.train()
    first = trainer.state.log_history[0]
    means = [first[f"rewards/{f.__name__}/mean"] for f in funcs]
    assert means[0] == means[1] == means[2] > 0  # the same lengths three ways (before: grpokit crashed)


def logs(prompts, completions, log_metric, **kwargs):
    log_metric("my/metric", 2.0 * len(completions))
    log_metric("my/metric", 1.0)
    return [0.0 for _ in completions]


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_reward_functions_log_is_reported_by_evaluate(backend, chat_model, tmp_path):
    mod = importlib.import_module(backend)
    args = small(mod, tmp_path, max_steps=1, per_device_eval_batch_size=4)
    trainer = mod.GRPOTrainer(
        chat_model,
        reward_funcs=logs,
        args=args,
        train_dataset=Dataset.from_list(ROWS),
        eval_dataset=Dataset.from_list(ROWS[:4]),
    )
    metrics = trainer.evaluate()
    # two eval batches of 4 completions, each logging 2 * 4 = 8 and 1: mean 4.5 a batch, 4.5 over both
    assert metrics["eval_my/metric"] == 4.5  # before: missing under grpokit.trl


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_streamed_train_datasets_epoch_is_max_steps(backend, chat_model, tmp_path):
    mod = importlib.import_module(backend)
    stream = Dataset.from_list([{"prompt": f"q{i} "} for i in range(40)]).to_iterable_dataset()
    args = small(mod, tmp_path, max_steps=5, num_iterations=2, steps_per_generation=2)
    trainer = mod.GRPOTrainer(chat_model, reward_funcs=length, args=args, train_dataset=stream)
    trainer.train()
    # transformers counts a dataloader without a length as one epoch of max_steps: epoch = step / 5
    # (before: steps per epoch from the rows read, 8 steps, so 0.125 ... 0.625)
    assert [h["epoch"] for h in trainer.state.log_history] == [0.2, 0.4, 0.6, 0.8, 1.0, 1.0]
    assert trainer.state.num_train_epochs == sys.maxsize  # the epochs transformers' loop would run (before: 3.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_completion_column_does_not_reach_reward_functions(backend, chat_model, tmp_path):
    mod = importlib.import_module(backend)
    seen = {}

    def record(prompts, completions, **kwargs):
        seen.update(kwargs)
        return [0.0 for _ in completions]

    rows = [{"prompt": f"q{i} ", "completion": f"gold {i}", "sol": i} for i in range(2)]
    args = small(mod, tmp_path, max_steps=1, per_device_train_batch_size=2)
    mod.GRPOTrainer(chat_model, reward_funcs=record, args=args, train_dataset=Dataset.from_list(rows)).train()
    # TRL's _calculate_rewards passes every column but prompt, completion and completion_ids (before: grpokit.trl
    # passed completion=["gold 0", "gold 0"] too); sol reaches it, each row's value for both of its 2 completions
    assert "completion" not in seen and sorted(seen["sol"]) in ([0, 0], [1, 1])


def test_a_prompt_without_room_for_its_completion_is_refused_before_any_step(tmp_path):
    """A GPT-2 of 64 learned positions, a 60-token prompt, max_completion_length=16: TRL 1.16 raises IndexError
    inside its first generation; grpokit.trl raised the same (before), and now refuses in TRL's terms."""
    import grpokit.trl as gk
    from helpers.trl_models import make_gpt2_chat_model

    model = str(make_gpt2_chat_model(tmp_path / "gpt2", n_positions=64))
    rows = Dataset.from_list([{"prompt": "say " + "ab" * 27 + w} for w in ("ab", "cd")])  # 4 + 54 + 2 = 60 tokens
    args = small(gk, tmp_path / "out", max_steps=1, max_completion_length=16)
    with pytest.raises(ConfigError) as e:
        gk.GRPOTrainer(model, reward_funcs=length, args=args, train_dataset=rows).train()
    assert str(e.value).startswith(  # 60 + 16 = 76 > 64
        "the longest training prompt (row 0, 60 tokens) and max_completion_length=16 make 76 tokens, more than the "
        "model's context of 64, whose positions are a learned table with no row past it; shorten the prompts or "
        "lower max_completion_length"
    )
