"""What callbacks ask through ``control`` and which callbacks the list holds, as transformers' Trainer under
TRL 1.16: should_log / should_evaluate / should_save honoured either way, should_epoch_stop honoured in the
last epoch and refused before it, unknown flags refused; transformers' default callbacks (DefaultFlowCallback,
the report_to trackers, PrinterCallback / ProgressCallback) in the list and removable; trackers fed
log_history's entries at TRL's steps under transformers' names."""

from __future__ import annotations

import glob

import pytest
from datasets import Dataset
from transformers import TrainerCallback

from grpokit.config import ConfigError
from grpokit.record.trackers import SINGLE_VALUE_SCALARS, _series, rewrite_logs
from grpokit.train.callbacks import Callbacks, Control, RunState
from grpokit.trl import GRPOConfig, GRPOTrainer
from grpokit.trl.default_callbacks import RESETS, TrlControl
from helpers.trl_models import small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh")])


def short(completions, **kwargs):
    return [-len(c[0]["content"]) / 10 for c in completions]


class AskAtStep1(TrainerCallback):
    """Sets the given flags at the end of step 1 (the cb_control scenario checked against TRL 1.16)."""

    def __init__(self, **flags):
        self.flags = flags

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 1:
            for name, value in self.flags.items():
                setattr(control, name, value)
        return control


def run(model, out, callbacks, **kw):
    """grpokit.trl's GRPOTrainer on the tiny chat ``model`` with the small CPU arguments and ``kw``."""
    a = small_args(GRPOConfig, out, **{"report_to": "none", **kw})
    return GRPOTrainer(model, reward_funcs=[short], train_dataset=DATA, eval_dataset=DATA, args=a, callbacks=callbacks)


def entries(tr):
    """(step, which of loss / eval_loss / train_runtime the entry has) per log_history entry."""
    keys = ("loss", "eval_loss", "train_runtime")
    return [(h["step"], [k for k in keys if k in h]) for h in tr.state.log_history]


def checkpoints(out):
    return sorted(p.rsplit("/", 1)[1] for p in glob.glob(f"{out}/checkpoint-*"))


# ---- the control object and the handler's resets (no model)


def test_grpokits_control_refuses_a_flag_it_does_not_read_in_one_sentence():
    c = Control()
    c.should_save = c.should_evaluate = c.should_training_stop = True
    with pytest.raises(AttributeError, match=r"^control.should_log is not a flag of grpokit's Control \(grpokit "):
        c.should_log = True
    with pytest.raises(AttributeError, match=r"should_epoch_stop .*should_training_stop ends the run"):
        c.should_epoch_stop = True
    with pytest.raises(AttributeError, match=r"^control.should_stop is not a flag"):
        c.should_stop = True  # a typo would otherwise be read by nothing


def test_trl_control_is_transformers_and_refuses_a_name_it_lacks():
    from transformers import TrainerControl

    c = TrlControl()
    assert isinstance(c, TrainerControl)
    c.should_epoch_stop = True
    with pytest.raises(AttributeError, match=r"^control.should_push is not a flag of transformers' TrainerControl"):
        c.should_push = True


def test_handler_clears_flags_before_an_event_and_a_returned_control_replaces_the_flags():
    class Returns:
        def on_step_begin(self, args, state, control, **kw):
            assert not control.should_log and not control.should_save  # cleared before any callback runs
            fresh = TrlControl()
            fresh.should_evaluate = True
            return fresh  # transformers: the returned object is the control from here on

        def on_log(self, args, state, control, logs=None, **kw):
            assert not control.should_log

    cbs = Callbacks([Returns()], None, RunState(), events=tuple(RESETS), control=TrlControl(), resets=RESETS)
    cbs.control.should_log = cbs.control.should_save = True
    c = cbs("on_step_begin")
    assert (c.should_evaluate, c.should_log, c.should_save) == (True, False, False)
    c.should_log = True
    assert cbs("on_log", logs={}).should_log is False


def test_transformers_names_of_a_log_entry():
    # eval_ -> eval/, test_ -> test/, everything else under train/ (transformers' rewrite_logs)
    assert rewrite_logs({"loss": 1.0, "eval_loss": 2.0, "eval_rewards/f/mean": 3.0, "test_x": 4.0, "epoch": 0.5}) == {
        "train/loss": 1.0,
        "eval/loss": 2.0,
        "eval/rewards/f/mean": 3.0,
        "test/x": 4.0,
        "train/epoch": 0.5,
    }
    # W&B and Trackio rows: the final entry's totals left out, the step as train/global_step, NaN dropped
    final = {k: 1.0 for k in SINGLE_VALUE_SCALARS}
    assert _series({**final, "num_tokens": 7.0, "loss": float("nan")}, 4) == {
        "train/num_tokens": 7.0,
        "train/global_step": 4.0,
    }


# ---- runs on the tiny chat model


def test_should_save_evaluate_and_log_set_by_a_callback_are_carried_out_at_that_step(chat_model, tmp_path):
    """max_steps=3 with logging_steps and save_steps 100 and no eval_strategy: nothing is due before the end.
    TRL 1.16 (the same script run with ``from trl``): a callback asking at step 1 gets checkpoint-1, a log entry
    with loss at step 1 and an evaluation (eval_loss) at step 1; the end adds checkpoint-3 (the last step of
    save_strategy=steps) and the final entry."""
    out = tmp_path / "asked"
    tr = run(
        chat_model,
        out,
        [AskAtStep1(should_save=True, should_evaluate=True, should_log=True)],
        max_steps=3,
        save_strategy="steps",
        save_steps=100,
        logging_steps=100,
        eval_strategy="no",
    )
    tr.train()
    assert entries(tr) == [(1, ["loss"]), (1, ["eval_loss"]), (3, ["train_runtime"])]
    assert checkpoints(out) == ["checkpoint-1", "checkpoint-3"]


def test_a_callback_skips_scheduled_logs_evaluations_and_checkpoints(chat_model, tmp_path):
    """Every step is a log, eval and save step (1 each), max_steps=2; the callback clears the three flags at step
    1: step 1 has no entry, no evaluation, no checkpoint; step 2 has its own (transformers' DefaultFlowCallback
    sets the flags before the user's callbacks, who may clear them)."""
    out = tmp_path / "skipped"
    tr = run(
        chat_model,
        out,
        [AskAtStep1(should_save=False, should_evaluate=False, should_log=False)],
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=1,
        per_device_eval_batch_size=4,
    )
    tr.train()
    # step 2's loss entry averages steps 1 and 2 (transformers' tr_loss since the last log)
    assert entries(tr) == [(2, ["loss"]), (2, ["eval_loss"]), (2, ["train_runtime"])]
    assert checkpoints(out) == ["checkpoint-2"]


def test_should_epoch_stop_ends_the_last_epoch_and_is_refused_before_it(chat_model, tmp_path):
    """4 prompts, 1 prompt (4 completions) a step: 4 steps an epoch. max_steps=3 runs one epoch, so an epoch stop
    at step 1 ends the run there, as transformers' epoch loop has no epoch after it; max_steps=6 runs two, and
    a stop in the first cannot be carried out."""
    tr = run(chat_model, tmp_path / "last", [AskAtStep1(should_epoch_stop=True)], max_steps=3)
    tr.train()
    assert tr.state.global_step == 1
    tr = run(chat_model, tmp_path / "first", [AskAtStep1(should_epoch_stop=True)], max_steps=6)
    with pytest.raises(ConfigError, match=r"^control.should_epoch_stop=True at TRL step 1: grpokit.trl cannot end an"):
        tr.train()


def test_default_callbacks_are_listed_and_removing_one_returns_it_and_stops_what_it_stands_for(chat_model, tmp_path):
    """As TRL's remove_cb.py run: the list is DefaultFlowCallback, TensorBoardCallback, the user's, PrinterCallback;
    pop_callback by class returns an instance of transformers' class; without TensorBoardCallback no event file
    is written, without DefaultFlowCallback nothing is logged or saved on schedule (only the final entry)."""
    from transformers.integrations import TensorBoardCallback
    from transformers.trainer_callback import DefaultFlowCallback, PrinterCallback

    out = tmp_path / "removed"
    mine = AskAtStep1()
    tr = run(chat_model, out, [mine], max_steps=2, logging_steps=1, save_steps=1, report_to="tensorboard")
    names = ["DefaultFlowCallback", "TensorBoardCallback", "AskAtStep1", "PrinterCallback"]
    assert [type(c).__name__ for c in tr._callbacks] == names
    assert isinstance(tr.pop_callback(TensorBoardCallback), TensorBoardCallback)
    assert isinstance(tr.pop_callback(DefaultFlowCallback), DefaultFlowCallback)
    printer = tr._callbacks[-1]
    tr.remove_callback(printer)  # by instance
    assert tr.pop_callback(PrinterCallback) is None  # gone already: None, as transformers
    assert [type(c).__name__ for c in tr.callback_handler.callbacks] == ["AskAtStep1"]
    tr.train()
    assert not glob.glob(f"{out}/**/events.out.tfevents*", recursive=True)
    assert entries(tr) == [(2, ["train_runtime"])] and checkpoints(out) == []


def test_tensorboard_gets_log_historys_entries_at_trls_steps(chat_model, tmp_path):
    """The tb_steps.py run: num_iterations=2 (2 TRL steps a sampling round), max_steps=4, logging_steps=1, an
    evaluation every 2 steps. TRL 1.16's event file has train/loss at steps 1..4, train/reward at 1 and 3 (the
    rounds' first steps carry the sampling metrics), eval/loss and eval/reward at 2 and 4; so has grpokit's."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    tr = run(
        chat_model,
        out,
        None,
        max_steps=4,
        num_iterations=2,
        logging_steps=1,
        report_to="tensorboard",
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=4,
    )
    tr.eval_dataset = DATA.select(range(1))
    tr.train()
    (events,) = glob.glob(f"{out}/**/events.out.tfevents*", recursive=True)
    acc = EventAccumulator(events)
    acc.Reload()

    def steps(tag):
        return [e.step for e in acc.Scalars(tag)]

    assert steps("train/loss") == [1, 2, 3, 4] and steps("train/reward") == [1, 3]
    assert steps("eval/loss") == [2, 4] and steps("eval/reward") == [2, 4]
    assert steps("train/train_runtime") == [4]  # the final entry, at the last step
    assert not any(t.startswith("train/eval") for t in acc.Tags()["scalars"])


def test_a_resumed_runs_tensorboard_holds_each_trl_step_once(chat_model, tmp_path):
    """num_iterations=2: a sampling round is 2 TRL steps, so checkpoint-2 is grpokit's step 1. A 4-step run resumed
    from checkpoint-2 logs TRL steps 3 and 4 again in a second event file; the sink marks the restart at TRL's step
    3 (not grpokit's 2, which would hide the first session's step 2), so the folder reads steps 1-4 once each,
    the final entry once."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    kw = dict(max_steps=4, num_iterations=2, logging_steps=1, save_steps=2, report_to="tensorboard")
    run(chat_model, out, None, **kw).train()
    run(chat_model, out, None, **kw).train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert len(glob.glob(f"{out}/tensorboard/events.out.tfevents*")) == 2  # (earlier-runs/ keeps a copy of the first)
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]
    assert [e.step for e in acc.Scalars("train/train_runtime")] == [4]
