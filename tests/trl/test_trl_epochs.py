"""grpokit.trl's epochs, worked by hand: TRL's steps per epoch (whole generation batches of train_dataset,
as its RepeatSampler keeps them), the run length from num_train_epochs, and save / eval / logging
strategy "epoch" (tests/trl/test_trl_scripts.py checks the same against TRL itself)."""

from __future__ import annotations

import types

import pytest

from grpokit.config import ConfigError
from grpokit.train.callbacks import Control
from grpokit.trl import best
from grpokit.trl.args.batch import micro_steps_per_epoch, state_epochs, steps_per_epoch, trl_epoch
from grpokit.trl.bridge import StepBridge
from grpokit.trl.config import GRPOConfig
from grpokit.trl.default_callbacks import DefaultFlowCallback
from grpokit.trl.mapping import to_config


@pytest.mark.parametrize(
    "kwargs, rows, expected",
    [
        # 8 completions a step / G 2 = 4 prompts a generation batch: 10 rows hold 2 whole batches (2 rows dropped)
        (dict(per_device_train_batch_size=8, num_generations=2), 10, 2),
        # each batch feeds num_iterations 3 optimizer steps: 2 batches x 3
        (dict(per_device_train_batch_size=8, num_generations=2, num_iterations=3), 10, 6),
        # steps_per_generation 2: a generation batch of 16 completions = 8 prompts, feeding 2 steps:
        # 10 // 8 = 1 batch x 2
        (dict(per_device_train_batch_size=8, num_generations=2, steps_per_generation=2), 10, 2),
        # gradient_accumulation_steps 2 (steps_per_generation follows it): 16 completions, 8 prompts, 1 step per batch
        (dict(per_device_train_batch_size=8, num_generations=2, gradient_accumulation_steps=2), 16, 2),
        # fewer rows than one generation batch: transformers still counts 1 step an epoch
        (dict(per_device_train_batch_size=8, num_generations=2), 3, 1),
    ],
)
def test_steps_per_epoch_by_hand(kwargs, rows, expected):
    assert steps_per_epoch(GRPOConfig("o", **kwargs), rows, 1) == expected


def test_a_stream_is_one_epoch_of_max_steps_and_state_epochs_are_transformers():
    """transformers, for a dataloader without a length: max_steps is one epoch and the loop's epochs are
    sys.maxsize; with a length, ceil(max_steps / steps per epoch), or ceil(num_train_epochs) without max_steps
    (before: the steps of the rows a stream read, and num_train_epochs as given)."""
    import sys

    a = GRPOConfig("o", per_device_train_batch_size=8, num_generations=2, max_steps=5)
    assert steps_per_epoch(a, 10, 1, streamed=True) == 5  # not 2, the steps of 10 rows read
    assert state_epochs(a, 5, 5, streamed=True) == sys.maxsize
    assert state_epochs(a, 5, 2, streamed=False) == 3  # 5 steps of 2 an epoch: 3 epochs begun
    epochs = GRPOConfig("o", per_device_train_batch_size=8, num_generations=2, num_train_epochs=2.5)
    assert state_epochs(epochs, 5, 2, streamed=False) == 3  # ceil(2.5)


def test_two_processes_share_each_generation_batch():
    # 2 processes x 8 completions = 16 completions, 8 prompts a batch: 16 rows are 2 batches, 2 steps an epoch
    assert steps_per_epoch(GRPOConfig("o", per_device_train_batch_size=8, num_generations=2), 16, 2) == 2


def test_epoch_strategies_map_to_whole_rounds():
    # 10 rows, 4 prompts a round, num_iterations 2: an epoch is 2 rounds = 4 TRL steps;
    # 1.5 epochs = 6 TRL steps = 3 rounds
    a = GRPOConfig(
        "o",
        per_device_train_batch_size=8,
        num_generations=2,
        num_iterations=2,
        num_train_epochs=1.5,
        save_strategy="epoch",
        logging_strategy="epoch",
        eval_strategy="epoch",
        log_completions=True,
    )
    c = to_config(a, num_rows=10, world_size=1)
    assert (c.train.steps, c.optim.schedule_steps, c.train.save_every) == (3, 6, 2)
    assert (c.record.console_every, c.record.samples_every, c.train.keep_checkpoints) == (
        2,
        2,
        3,
    )  # keep all: one per grpokit step at most (a callback's should_save may ask for any), 3


def test_the_rows_short_of_a_generation_batch_are_not_an_epoch():
    # grpokit once counted ceil(epochs * rows / prompts): 10 rows / 4 = 3 rounds an epoch; TRL counts 2
    assert (
        to_config(
            GRPOConfig("o", per_device_train_batch_size=8, num_generations=2, num_train_epochs=1), num_rows=10
        ).train.steps
        == 2
    )


def test_other_strategies_are_one_sentence():
    with pytest.raises(ConfigError, match="save_strategy='best' is not supported by grpokit; valid: steps, epoch, no"):
        to_config(GRPOConfig("o", save_strategy="best"), num_rows=10)  # transformers has it, grpokit does not
    for name, value in (("eval_strategy", "best"), ("logging_strategy", "sometimes")):  # transformers has neither
        with pytest.raises(
            ConfigError, match=f"^GRPOConfig argument {name}='{value}' is not valid; use one of no, steps, epoch$"
        ):
            GRPOConfig("o", **{name: value})


def test_load_best_model_at_end_takes_epoch_strategies():
    best.check_args(GRPOConfig("o", load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch"))
    with pytest.raises(ConfigError, match="set both to 'steps' or both to 'epoch'"):
        best.check_args(GRPOConfig("o", load_best_model_at_end=True, eval_strategy="epoch", save_strategy="steps"))


def drive(bridge: StepBridge, rounds: int, per_round: int) -> None:
    """grpokit's loop: per round the optimizer updates (each begun, then applied), then the round's end."""
    state, control = types.SimpleNamespace(epoch=0.0), Control()
    for _ in range(rounds):
        for k in range(per_round):
            bridge.on_update_begin(None, state, control)
            bridge.on_optimizer_step(None, None, None, metrics={"loss": 1.0, "learning_rate": 0.1 * (k + 1)})
        bridge.on_step_end(None, state, control, metrics={"reward": 0.5})


def test_epoch_ends_log_and_evaluate_as_transformers():
    # 2 TRL steps an epoch, 5 steps in all: epochs end at steps 2 and 4, and the run's end (step 5) ends the last one
    evaluations = []
    a = GRPOConfig("o", logging_strategy="epoch", eval_strategy="epoch", eval_delay=1.5, max_steps=5)
    bridge = StepBridge(
        a, [DefaultFlowCallback()], 5, lambda: evaluations.append(bridge.state.global_step) or {}, lambda p, s: None, {}
    )
    bridge.steps_per_epoch = 2
    drive(bridge, 5, 1)
    logged = [(h["step"], h["epoch"]) for h in bridge.state.log_history]
    assert logged == [(2, 1.0), (4, 2.0), (5, 2.5)]
    assert evaluations == [4, 5]  # eval_delay 1.5 epochs: not after the first epoch (epoch 1.0 < 1.5)


def test_an_epoch_log_holds_the_last_steps_rate_and_the_mean_loss():
    # one round of 2 updates at rates 0.1 and 0.2: transformers logs the last step's rate, the losses' mean
    a = GRPOConfig("o", logging_strategy="epoch", max_steps=2)
    bridge = StepBridge(a, [DefaultFlowCallback()], 2, dict, lambda p, s: None, {})
    bridge.steps_per_epoch = 2
    drive(bridge, 1, 2)
    (entry,) = bridge.state.log_history
    assert (entry["learning_rate"], entry["loss"], entry["step"]) == (0.2, 1.0, 2)


def test_logging_first_step_logs_whatever_the_strategy_as_transformers():
    bridge = StepBridge(
        GRPOConfig("o", logging_strategy="no", logging_first_step=True, max_steps=3),
        [DefaultFlowCallback()],
        3,
        dict,
        lambda p, s: None,
        {},
    )
    drive(bridge, 3, 1)
    assert [h["step"] for h in bridge.state.log_history] == [1]


@pytest.mark.parametrize(
    "kwargs, rows, steps, expected",
    [
        (
            dict(
                per_device_train_batch_size=2, num_generations=2, gradient_accumulation_steps=2, steps_per_generation=3
            ),
            10,
            6,
            # a generation batch: 2 * 3 = 6 completions = 3 prompts; 10 // 3 = 3 batches x 3 micro-batches = 9
            # micro-batches an epoch, ceil(9 / 2) = 5 updates; update k stands at min(2k, 9) / 9, the epoch's
            # last one (1 micro-batch) at 9/9 = 1; the 6th is the next epoch's first: 1 + 2/9
            [2 / 9, 4 / 9, 6 / 9, 8 / 9, 1.0, 1 + 2 / 9],
        ),
        (
            # GA 3, steps_per_generation 2, num_iterations 2: a batch of 2 * 2 = 4 completions = 2 prompts;
            # 10 // 2 = 5 batches x 2 iterations x 2 micro-batches = 20 an epoch, ceil(20 / 3) = 7 updates:
            # 3/20 = 0.15 a step, the 7th at 20/20 (TRL 1.16 logs 0.15, 0.3 ... 0.9, 1.0)
            dict(
                per_device_train_batch_size=2,
                num_generations=2,
                gradient_accumulation_steps=3,
                steps_per_generation=2,
                num_iterations=2,
            ),
            10,
            7,
            [0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0],
        ),
    ],
)
def test_epoch_counts_micro_batches_as_transformers(kwargs, rows, steps, expected):
    """transformers' state.epoch = epoch + (micro-batch + 1) / micro-batches an epoch, not updates / updates an
    epoch (before: 0.2, 0.4 ... and 1/7 = 0.1429 a step for these two)."""
    a = GRPOConfig("o", **kwargs)
    per_epoch, micro = steps_per_epoch(a, rows, 1), micro_steps_per_epoch(a, rows, 1)
    got = [trl_epoch(s, per_epoch, micro, a.gradient_accumulation_steps) for s in range(1, steps + 1)]
    assert got == pytest.approx(expected)


def test_a_streams_epoch_stays_max_steps():
    # a stream: max_steps 5 is one epoch of 5 * GA micro-batches, so step s stands at s / 5 whatever GA
    a = GRPOConfig("o", per_device_train_batch_size=2, num_generations=2, gradient_accumulation_steps=3, max_steps=5)
    per_epoch, micro = steps_per_epoch(a, 10, 1, streamed=True), micro_steps_per_epoch(a, 10, 1, streamed=True)
    assert [trl_epoch(s, per_epoch, micro, 3) for s in range(1, 6)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_steps_per_epoch_are_the_epochs_micro_batches_in_updates():
    from grpokit.trl.args.batch import epoch_updates, micro_steps_per_epoch

    assert epoch_updates(10, 4) == 3 and epoch_updates(8, 4) == 2  # a shorter last update counts: ceil
    assert epoch_updates(0, 4) == 1  # transformers counts at least one step an epoch
    # gradient_accumulation_steps 3, steps_per_generation 3 (follows it), per_device 2, G 2: 3 prompts a batch;
    # 7 rows: 2 batches x 3 micro-batches = 6 micro-batches, 2 updates; a stream of max_steps 4: 12, 4; 0 rows: 1, 1
    kw = dict(per_device_train_batch_size=2, num_generations=2, gradient_accumulation_steps=3, max_steps=4)
    a = GRPOConfig("o", **kw)
    for rows, streamed, micro, steps in ((7, False, 6, 2), (7, True, 12, 4), (0, False, 1, 1)):
        assert micro_steps_per_epoch(a, rows, 1, streamed) == micro
        assert steps_per_epoch(a, rows, 1, streamed) == steps == epoch_updates(micro, 3)


def test_fewer_rows_than_one_generation_batch_are_one_sentence():
    from grpokit.trl.args.batch import check_whole_batch

    a = GRPOConfig("o", per_device_train_batch_size=8, num_generations=2)  # 8 completions / G 2 = 4 prompts a batch
    check_whole_batch(a, 4, 1)  # one whole batch: trains
    with pytest.raises(ConfigError) as e:
        check_whole_batch(a, 3, 1)
    assert str(e.value) == (
        "train_dataset has 3 rows, fewer than the 4 prompts of one generation batch (per_device_train_batch_size * "
        "steps_per_generation * processes / num_generations = 8 * 1 * 1 / 2), and TRL's RepeatSampler yields whole "
        "generation batches only, so no step would train; give at least 4 rows, or lower per_device_train_batch_size "
        "or steps_per_generation"
    )
    # the sampler serves whole generation batches, as TRL's: an epoch's rows after its last whole batch wait
    assert to_config(a, num_rows=10).data.drop_last is True


def _sols(prompts, completions, sol, **kwargs):
    _sols.seen.append(list(sol))
    return [0.0 for _ in completions]


@pytest.mark.parametrize("backend", ["grpokit.trl", pytest.param("trl", marks=pytest.mark.slow)])
def test_a_dataset_smaller_than_a_generation_batch(backend, chat_model, tmp_path):
    """3 rows, 4 prompts a generation batch: TRL's RepeatSampler yields no batch, so max_steps=2 trains 0 steps
    (and num_train_epochs raises "args.max_steps must be set to a positive value"); grpokit.trl trained 2 steps
    of batches holding a prompt twice ([ab, ab, cd, cd, ef, ef, ab, ab]) and now refuses when train() starts."""
    import importlib

    from datasets import Dataset

    from helpers.trl_models import small_args

    mod, _sols.seen = importlib.import_module(backend), []
    rows = Dataset.from_list([{"prompt": f"say {w}", "sol": w} for w in ("ab", "cd", "ef")])
    args = small_args(
        mod.GRPOConfig, tmp_path, max_steps=2, per_device_train_batch_size=8, num_generations=2, report_to="none"
    )
    trainer = mod.GRPOTrainer(chat_model, reward_funcs=_sols, args=args, train_dataset=rows)
    if backend == "trl":
        trainer.train()
        assert trainer.state.global_step == 0 and _sols.seen == []
        return
    with pytest.raises(ConfigError, match=r"^train_dataset has 3 rows, fewer than the 4 prompts of one generation"):
        trainer.train()
    assert _sols.seen == []


def test_evaluate_before_train_needs_no_whole_training_batch(chat_model, tmp_path):
    """3 training rows, 4 prompts a generation batch: TRL evaluates (its RepeatSampler is only read by train());
    before, grpokit.trl refused at the first use of the trainer (evaluate(), .state, .model)."""
    from datasets import Dataset

    import grpokit.trl as mod
    from helpers.trl_models import small_args

    rows = Dataset.from_list([{"prompt": f"say {w}", "sol": w} for w in ("ab", "cd", "ef")])
    args = small_args(
        mod.GRPOConfig, tmp_path, max_steps=2, per_device_train_batch_size=8, num_generations=2, report_to="none",
        per_device_eval_batch_size=2, num_generations_eval=2,
    )  # fmt: skip
    trainer = mod.GRPOTrainer(chat_model, reward_funcs=_sols, args=args, train_dataset=rows, eval_dataset=rows)
    metrics = trainer.evaluate()  # before: ConfigError "train_dataset has 3 rows, fewer than ..."
    assert "eval_reward" in metrics and trainer.state.global_step == 0
    with pytest.raises(ConfigError, match=r"^train_dataset has 3 rows, fewer than the 4 prompts of one generation"):
        trainer.train()
