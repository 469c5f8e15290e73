"""transformers' Trainer behaviours that GRPOConfig switches and grpokit.trl carries out with their meaning
(issue 46, deliverable 5): logging_nan_inf_filter, skip_memory_metrics, restore_callback_states_from_checkpoint.
TRL's own run is the oracle where it can run here."""

from __future__ import annotations

import json
import math
import types

import pytest
from datasets import Dataset
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from grpokit.train.callbacks import Control
from grpokit.trl.bridge import StepBridge
from grpokit.trl.config import GRPOConfig
from grpokit.trl.default_callbacks import DefaultFlowCallback
from helpers.trl_models import small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd")])


def reward(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


def _logged_losses(losses, **kw):
    """The bridge's log_history losses and train_loss for one update a round with these step losses."""
    a = GRPOConfig("o", max_steps=len(losses), logging_steps=2, **kw)
    bridge = StepBridge(a, [DefaultFlowCallback()], len(losses), dict, lambda p, s: None, {})
    state, control = types.SimpleNamespace(epoch=0.0), Control()
    for loss in losses:
        bridge.on_update_begin(None, state, control)
        bridge.on_optimizer_step(None, None, None, metrics={"loss": loss})
        bridge.on_step_end(None, state, control, metrics={})
    bridge.on_train_end(None, None, None)
    return [h["loss"] for h in bridge.state.log_history if "loss" in h], bridge.final["train_loss"]


def test_logging_nan_inf_filter_replaces_a_non_finite_loss_by_the_windows_running_loss():
    # transformers adds tr_loss / (1 + steps since the last log) in place of a NaN/inf loss: windows of 2 steps.
    # [1, nan]: nan -> 1 / 2 = 0.5, logged (1 + 0.5) / 2 = 0.75; [3, inf] : inf -> 3 / 2, logged 2.25.
    # train_loss: (1 + 0.5 + 3 + 1.5) / 4 = 1.5
    assert _logged_losses([1.0, math.nan, 3.0, math.inf]) == ([0.75, 2.25], 1.5)
    # a window's first step: 0 / 1 = 0
    assert _logged_losses([math.nan, 4.0]) == ([2.0], 2.0)
    logged, train_loss = _logged_losses([1.0, math.nan, 3.0, 5.0], logging_nan_inf_filter=False)
    assert math.isnan(logged[0]) and logged[1] == 4.0 and math.isnan(train_loss)  # as is


def test_skip_memory_metrics_false_adds_transformers_memory_metrics(chat_model, tmp_path):
    from grpokit.trl import GRPOTrainer

    args = small_args(
        GRPOConfig, tmp_path, max_steps=1, report_to="none", save_strategy="no", skip_memory_metrics=False
    )
    tr = GRPOTrainer(chat_model, reward_funcs=[reward], train_dataset=DATA, args=args)
    out = tr.train()
    mem = {k for k in out.metrics if "_mem_" in k}
    expected = {f"{s}_mem_cpu_{t}_delta" for s in ("init", "train") for t in ("alloc", "peaked")}
    assert mem == expected | {"before_init_mem_cpu"}, mem  # the CPU's: no CUDA here
    assert mem <= set(tr.state.log_history[-1])  # in the final entry, as transformers logs its train metrics
    assert out.metrics["before_init_mem_cpu"] > 0 and out.metrics["train_mem_cpu_peaked_delta"] >= 0
    evaluated = tr.evaluate(DATA)
    assert {k for k in evaluated if "_mem_" in k} == {"eval_mem_cpu_alloc_delta", "eval_mem_cpu_peaked_delta"}
    trl = pytest.importorskip("trl")  # the same keys from TRL's own run
    theirs = trl.GRPOTrainer(
        chat_model,
        reward_funcs=[reward],
        train_dataset=DATA,
        args=small_args(
            trl.GRPOConfig,
            tmp_path / "trl",
            max_steps=1,
            report_to="none",
            save_strategy="no",
            skip_memory_metrics=False,
        ),
    )
    assert {k for k in theirs.train().metrics if "_mem_" in k} == mem


class Counter(TrainerCallback, ExportableState):
    """An ExportableState callback: the steps it has seen, and a setting it is built with."""

    def __init__(self, every: int = 1):
        self.every, self.steps = every, 0

    def on_step_end(self, args, state, control, **kw):
        self.steps += 1

    def state(self) -> dict:
        return {"args": {"every": self.every}, "attributes": {"steps": self.steps}}


def _run(module, model, out, max_steps, callbacks, resume=None, **kw):
    args = small_args(module.GRPOConfig, out, max_steps=max_steps, save_steps=1, report_to="none", **kw)
    tr = module.GRPOTrainer(model, reward_funcs=[reward], train_dataset=DATA, args=args, callbacks=callbacks)
    tr.train(resume_from_checkpoint=resume)
    return tr


def test_checkpoints_hold_stateful_callbacks_and_a_resume_restores_them(tmp_path):
    import grpokit.trl as grpokit_trl
    from helpers.trl_models import make_chat_model

    model, out = str(make_chat_model(tmp_path / "model")), tmp_path / "out"
    _run(grpokit_trl, model, out, 2, [Counter(3)])
    saved = json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())["stateful_callbacks"]
    control = {"should_epoch_stop": False, "should_evaluate": False, "should_log": False}
    assert saved == {
        "Counter": {"args": {"every": 3}, "attributes": {"steps": 1}},
        "TrainerControl": {"args": {**control, "should_save": True, "should_training_stop": False}, "attributes": {}},
    }
    last = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["stateful_callbacks"]
    assert last["Counter"]["attributes"] == {"steps": 2} and last["TrainerControl"]["args"]["should_training_stop"]
    resumed = _run(
        grpokit_trl,
        model,
        out,
        3,
        [Counter()],
        resume=True,
        restore_callback_states_from_checkpoint=True,
    )
    (cb,) = [c for c in resumed.callback_handler.callbacks if isinstance(c, Counter)]
    assert (cb.every, cb.steps) == (3, 3)  # rebuilt from checkpoint-2's state, then one more step
    trl = pytest.importorskip("trl")  # TRL writes the same states at the same checkpoint
    _run(trl, model, tmp_path / "trl", 2, [Counter(3)])
    theirs = json.loads((tmp_path / "trl" / "checkpoint-1" / "trainer_state.json").read_text())["stateful_callbacks"]
    assert theirs == saved


def test_without_restore_a_resumed_run_keeps_its_callbacks_as_passed(tmp_path):
    import grpokit.trl as grpokit_trl
    from helpers.trl_models import make_chat_model

    model, out = str(make_chat_model(tmp_path / "model")), tmp_path / "out"
    _run(grpokit_trl, model, out, 1, [Counter(3)])
    resumed = _run(grpokit_trl, model, out, 2, [Counter()], resume=True)
    (cb,) = [c for c in resumed.callback_handler.callbacks if isinstance(c, Counter)]
    assert (cb.every, cb.steps) == (1, 1)


def test_off_policy_mask_threshold_keeps_trls_meaning_at_zero():
    """TRL's 0 is a threshold (drift > 0 drops a negative-advantage completion), grpokit's 0 is off: the mapping
    hands grpokit 5e-324. Four completions, mean log-ratio (sampler - policy) 0, 1e-6, 0.75 and 0.75, advantages
    -1, -1, +1, -1: threshold 0 drops the 2nd and 4th, 0.5 the 4th (the 3rd has a positive advantage), 1 none;
    None masks nothing."""
    import torch

    from grpokit.algo.masks import offpolicy_sequences
    from grpokit.trl.mapping import to_config

    logp = torch.zeros(4, 2)
    sampler = torch.tensor([[0.0, 0.0], [2e-6, 0.0], [0.5, 1.0], [1.5, 0.0]])
    mask, adv = torch.ones(4, 2), torch.tensor([-1.0, -1.0, 1.0, -1.0])
    expected = {0: [False, True, False, True], 0.5: [False, False, False, True], 1: [False] * 4}

    def dropped(threshold):
        delta = to_config(GRPOConfig("o", off_policy_mask_threshold=threshold), num_rows=4).algo.offpolicy_delta
        if delta == 0:  # grpokit's off (algo/pipeline.py: 0 -> no mask)
            return [False] * 4
        return offpolicy_sequences(logp, sampler, adv[:, None].expand(4, 2), mask, delta).tolist()

    for threshold, drops in expected.items():
        assert dropped(threshold) == drops, threshold
    assert dropped(None) == [False] * 4
    trl = pytest.importorskip("trl")  # TRL's own mask on the same tensors: 0.0 where it drops
    for threshold, drops in expected.items():
        keep = trl.GRPOTrainer.get_off_policy_mask(adv[:, None], logp, sampler, mask, threshold)
        assert (keep[:, 0] == 0).tolist() == drops, threshold


@pytest.mark.parametrize("save_steps, shown", [(0, 0), (-1, -4), (0.5, 2), (3, 3)])
def test_state_save_steps_is_transformers(save_steps, shown):
    """transformers' state.save_steps: ceil(max_steps * value) below 1 (0 stays 0: no step checkpoint), else
    the value; callbacks read it. 4 steps."""
    bridge = StepBridge(GRPOConfig("o", save_steps=save_steps, max_steps=4), [], 4, dict, lambda p, s: None, {})
    assert bridge.state.save_steps == shown
