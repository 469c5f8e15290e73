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


class TwoRanks:
    """A 2-rank data-parallel context as TrlLoss sees it: every count summed over two equal ranks."""

    world_size, active = 2, True  # as train/distributed.py's DistContext of two processes

    def sum_float(self, x):
        return 2 * x

    def sum_floats(self, xs):
        return [2 * x for x in xs]


def test_sync_gradients_on_this_ranks_last_micro_batch_under_two_ranks():
    # One rank's slice of 4 rows, per_device_train_batch_size 2, one slice an update: this rank runs
    # ceil(4 / 2) = 2 micro-batches and syncs on its 2nd. The normalisers count both ranks' 8 rows, from which
    # the old count made 8 / 2 = 4 micro-batches: sync never came (before: [False, False], accumulation steps 4).
    from types import SimpleNamespace

    import torch

    from grpokit.algo.pipeline import UpdateInputs, loss_settings
    from grpokit.config import AlgoConfig, TrainConfig
    from grpokit.train.update import Accumulator, Forwards
    from grpokit.trl.contract.stages import TrlLoss
    from grpokit.types import TokenBatch

    cfg = SimpleNamespace(train=TrainConfig(), algo=AlgoConfig())
    seen = []
    model = torch.nn.Linear(1, 1)
    facade = SimpleNamespace(
        args=SimpleNamespace(per_device_train_batch_size=2),
        state=SimpleNamespace(global_step=0),
        accelerator=SimpleNamespace(sync_gradients=True),
        _generation_batch=None,
        _micro_at=(-1, 0),
        _get=lambda: SimpleNamespace(cfg=cfg),
        loss_is_scaled_for_ga=True,  # TRL's class attribute
    )
    facade.compute_loss = lambda m, batch, num_items_in_batch: (
        seen.append((facade.accelerator.sync_gradients, facade.current_gradient_accumulation_steps))
        or (m.weight.sum() * 0.0)
    )
    ids = torch.ones(4, 3, dtype=torch.long)
    mask = torch.ones(4, 2)
    batch = TokenBatch(ids, torch.ones(4, 3, dtype=torch.long), ids, ids[:, 1:], mask)
    settings, norms = loss_settings(AlgoConfig())
    inputs = UpdateInputs(batch, torch.zeros(4), mask, None, None, loss=settings, norms=norms)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    TrlLoss(facade)(model, opt, inputs, Accumulator(), Forwards(), dist=TwoRanks())
    assert seen == [(False, 2), (True, 2)]
    assert facade.accelerator.sync_gradients  # True again after the update's micro-batches


def test_update_micro_batches_by_hand():
    # 4 rows a rank, 2 a micro-batch = 2 a slice; 3 slices an update = 6; epochs of 2 steps x 4 slices = 8
    # slices: updates of 3, 3, 2 slices, so the epoch's last (update 2) has 2 x 2 = 4 and update 3 again 6.
    from grpokit.train.update_windows import BatchCounts, window_at, window_counts
    from grpokit.trl.contract.stages import update_micro_batches

    counts = BatchCounts(1.0, (1.0, 1.0, 1.0, 1.0), 4.0)

    def micro_batches(position):  # as the loop: the window of the update that holds slice number position
        window, _ = window_at(position, 3, 8)
        return update_micro_batches(window_counts(counts, position % 4, 4, window), 4, 2)

    assert [micro_batches(p) for p in (0, 3, 6, 8)] == [6, 6, 4, 6]  # the first slice of updates 0-3
    assert [micro_batches(p) for p in (1, 2, 7)] == [6, 6, 4]  # every slice of an update agrees
    assert update_micro_batches(None, 5, 2) == 3  # a slice that is its whole update: ceil(5 / 2)


def test_every_ranks_rows_are_gathered_once_a_round(chat_model, tmp_path, monkeypatch):
    # GA 2, per_device 2, 2 TRL steps: a generation batch of 4 rows is one round per step, 2 rounds. The loop
    # gathers every rank's rows once a round and hands them to the bridge's TRL sampling metrics and to the
    # step's metrics: 2 gathers (before: the bridge gathered them again, and rewards_NF a third time: 4).
    import grpokit.train.step_metrics as step_metrics

    calls, job_rows = [], step_metrics.job_rows
    monkeypatch.setattr(step_metrics, "job_rows", lambda sb, dist=None: calls.append(1) or job_rows(sb, dist))
    run(GRPOTrainer, GRPOConfig, chat_model, tmp_path / "g")
    assert len(calls) == 2


def test_batch_dict_by_hand():
    # One row: prompt [pad, 5] (left-padded), completion [6, 7] of which the loss trains on 6 only. TRL's dict:
    # prompt_ids [[0, 5]], prompt_mask [[0, 1]], completion_mask [[1, 1]], tool_mask [[1, 0]] (the loss mask
    # differs), num_items_in_batch 1.0; with the loss on both tokens no tool_mask.
    import torch

    from grpokit.trl.contract.stages import batch_dict
    from grpokit.types import TokenBatch

    ids, att = torch.tensor([[0, 5, 6, 7]]), torch.tensor([[0, 1, 1, 1]])
    batch = TokenBatch(ids, att, ids, ids[:, 2:], torch.ones(1, 2))
    out = batch_dict(batch, torch.tensor([0.5]), torch.tensor([[1.0, 0.0]]), 1.0)
    assert out["prompt_ids"].tolist() == [[0, 5]] and out["prompt_mask"].tolist() == [[0, 1]]
    assert out["completion_ids"].tolist() == [[6, 7]] and out["completion_mask"].tolist() == [[1, 1]]
    assert out["tool_mask"].tolist() == [[1, 0]] and out["num_items_in_batch"].item() == 1.0
    assert out["advantages"].tolist() == [0.5]
    assert "tool_mask" not in batch_dict(batch, torch.tensor([0.5]), torch.ones(1, 2), 2.0)
