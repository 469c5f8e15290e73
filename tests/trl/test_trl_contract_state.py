"""What a GRPOTrainer subclass reads of the trainer's state inside compute_loss and log(), as under TRL 1.16:
``_metrics["train"]`` holds the current batch's metrics before its loss and the log window's in log() before
``super().log``; ``accelerator.sync_gradients`` is True on an update's last micro-batch only; ``_step``
counts micro-batches (training_step calls)."""

from __future__ import annotations

import pytest
from datasets import Dataset

from grpokit.trl import GRPOConfig, GRPOTrainer
from helpers.trl_models import small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh")])


def short(completions, **kwargs):
    return [-len(c[0]["content"]) / 10 for c in completions]


def recording(base):
    """A subclass recording (_step, sync_gradients, len(_metrics["train"]["reward"])) in each compute_loss and
    the window's reward values in each training log()."""

    class Recording(base):
        in_loss: list = []
        in_log: list = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            rewards = self._metrics["train"].get("reward", [])
            self.in_loss.append((self._step, self.accelerator.sync_gradients, len(rewards)))
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        def log(self, logs, start_time=None):
            if start_time is not None and "loss" in logs:
                self.in_log.append(list(self._metrics["train"].get("reward", [])))
            super().log(logs, start_time)

    Recording.in_loss, Recording.in_log = [], []
    return Recording


def run(base, config, model, out):
    args = small_args(
        config,
        out,
        max_steps=2,
        logging_steps=2,
        report_to="none",
        seed=0,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
    )
    tr = recording(base)(model, reward_funcs=[short], train_dataset=DATA, args=args)
    tr.train()
    return tr


# GA 2, 2 steps: micro-batches 0 1 | 2 3; accelerate syncs on each update's second only. The batch's reward is in
# _metrics before its first loss: 1 value in update 1, 2 in update 2 (logging_steps 2 keeps the window open),
# and log() sees both before super().log, whose mean is the logged reward
# (before: sync True always, _step 0 0 2 2, _metrics empty in the first loss and in log())
EXPECTED_LOSS = [(0, False, 1), (1, True, 1), (2, False, 2), (3, True, 2)]


def test_a_subclass_reads_trls_state_in_compute_loss_and_log(chat_model, tmp_path):
    tr = run(GRPOTrainer, GRPOConfig, chat_model, tmp_path / "g")
    assert tr.in_loss == EXPECTED_LOSS
    (window,) = tr.in_log
    (logged,) = [e["reward"] for e in tr.state.log_history if "reward" in e]
    assert len(window) == 2 and sum(window) / 2 == pytest.approx(logged)
    assert tr.accelerator.sync_gradients  # True again outside an update


def test_trl_reads_the_same(chat_model, tmp_path):
    trl = pytest.importorskip("trl")
    tr = run(trl.GRPOTrainer, trl.GRPOConfig, chat_model, tmp_path / "t")
    assert tr.in_loss == EXPECTED_LOSS
    (window,) = tr.in_log
    assert len(window) == 2
