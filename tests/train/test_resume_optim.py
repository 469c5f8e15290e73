"""A resume with optim.* changed (recorded in config_history.yaml) trains with the new values from the checkpoint's
step on: the checkpoint's optimizer state brought back its own learning rate and weight decay, and the run went
on with them at exit 0 (docs/FAULTS.md advises resuming with a lower optim.lr after an instability)."""

from __future__ import annotations

import pytest
import torch

from grpokit.train import Trainer
from helpers.runs import ROWS, likes_a, tiny_cfg


def trainer(model_dir, run, resume=None, **over):
    cfg = tiny_cfg(model_dir, run, **{"train.steps": 4, "train.save_every": 2, "optim.schedule": "linear", **over})
    cfg.data.dataset = ""  # rows are passed directly
    return Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], resume=resume, quiet=True)


def test_a_changed_learning_rate_and_weight_decay_apply_from_the_checkpoints_step(tiny_model_dir, tmp_path):
    first = trainer(tiny_model_dir, tmp_path / "run", **{"train.steps": 2})
    first.train()
    moments = [s["exp_avg"].clone() for s in first.optimizer.state.values()]
    # linear decay over 4 updates (one per step here), warm-up 0: update s runs at (4 - s) / 4 of optim.lr
    again = trainer(tiny_model_dir, tmp_path / "run", tmp_path / "run", **{"optim.lr": 0.04, "optim.weight_decay": 0.1})
    (group,) = again.optimizer.param_groups
    assert group["lr"] == pytest.approx(0.04 * (4 - 2) / 4) and again.scheduler.base_lrs == [0.04]
    assert group["weight_decay"] == 0.1
    # the moments and the step count stay the checkpoint's
    assert all(torch.equal(m, s["exp_avg"]) for m, s in zip(moments, again.optimizer.state.values()))
    summary = again.train()
    assert summary["steps"] == 4
    lrs = [h["learning_rate"] for h in again.state.log_history]
    assert lrs == pytest.approx([0.04 * 2 / 4, 0.04 * 1 / 4])


def test_an_extended_run_resumes_at_its_new_schedules_rate(tiny_model_dir, tmp_path):
    """A run of 2 steps under linear decay ends at rate 0 (update 2 of 2); extended to 4 steps, its first resumed
    update runs at (4 - 2) / 4 of optim.lr, not at the 0 the checkpoint's optimizer held (before: one update at 0)."""
    trainer(tiny_model_dir, tmp_path / "run", **{"train.steps": 2}).train()
    again = trainer(tiny_model_dir, tmp_path / "run", tmp_path / "run")
    (group,) = again.optimizer.param_groups
    assert group["lr"] == pytest.approx(1e-2 * 2 / 4) and again.scheduler.base_lrs == [1e-2]
