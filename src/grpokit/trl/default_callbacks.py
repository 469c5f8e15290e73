"""The callbacks transformers' Trainer puts in front of and after the user's, under grpokit.trl.

TRL's ``trainer.callback_handler.callbacks`` starts as ``DefaultFlowCallback``, one callback per
``report_to`` tracker, the user's callbacks, then ``PrinterCallback`` (``disable_tqdm``) or
``ProgressCallback``. grpokit.trl's list holds the same classes in the same order, each standing for what
grpokit does in its place, so that ``pop_callback`` / ``remove_callback`` of one returns an instance of
the class TRL returns and switches off what it stands for:

* ``DefaultFlowCallback`` (transformers' subclassed): sets ``control.should_log`` / ``should_evaluate`` /
  ``should_training_stop`` at TRL's steps as transformers' does; ``should_save`` follows grpokit's
  checkpoint schedule (train.save_every: checkpoints fall between sampling rounds). Removed: no scheduled
  log, evaluation or checkpoint, as in transformers.
* ``_Tracker`` subclasses of TensorBoardCallback, WandbCallback, MLflowCallback and TrackioCallback: each
  hands every ``on_log`` entry (log_history's, at TRL's step) to grpokit's sink of that tracker, named as
  the transformers integration names it (trackers.py ``log_entry``). Removed: the tracker gets nothing (it
  is not opened when removed before the run is built).
* ``PrinterCallback`` is transformers' own (it prints each log entry); ``ProgressCallback`` (transformers'
  subclassed, its bar left out) stands for grpokit's console sink, which is closed when it is removed.

The control the callbacks share is ``TrlControl``: transformers' ``TrainerControl`` that refuses a flag it
does not have in one sentence (transformers would keep it and read nothing).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from transformers import TrainerControl, integrations, trainer_callback
from transformers.trainer_callback import PrinterCallback

TRL_EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_epoch_begin",
    "on_step_begin",
    "on_substep_end",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_step_end",
    "on_epoch_end",
    "on_evaluate",
    "on_prediction_step",
    "on_log",
    "on_save",
    "on_push_begin",
    "on_train_end",
)
"""transformers' TrainerCallback events grpokit.trl fires at TRL's points (bridge.py; on_predict: no predict())."""


RESETS = {
    "on_train_begin": ("should_training_stop",),
    "on_epoch_begin": ("should_epoch_stop",),
    "on_step_begin": ("should_log", "should_evaluate", "should_save"),
    "on_evaluate": ("should_evaluate",),
    "on_save": ("should_save",),
    "on_log": ("should_log",),
}
"""The flags transformers' CallbackHandler clears before an event's callbacks run."""


class TrlControl(TrainerControl):
    """transformers' ``TrainerControl``; a name that is not one of its flags is refused."""

    def __setattr__(self, name: str, value: Any) -> None:
        flags = [f.name for f in dataclasses.fields(TrainerControl)]
        if name not in flags:
            raise AttributeError(
                f"control.{name} is not a flag of transformers' TrainerControl, so nothing would read it; "
                f"its flags are {', '.join(flags)}"
            )
        object.__setattr__(self, name, value)


class DefaultFlowCallback(trainer_callback.DefaultFlowCallback):
    """transformers' DefaultFlowCallback, with ``should_save`` from grpokit's checkpoint schedule: ``save_due()``
    (set by the bridge) says whether grpokit's loop checkpoints after this TRL step."""

    save_due: Callable[[], bool] = staticmethod(lambda: False)

    def on_step_end(self, args, state, control, **kwargs):
        saving = control.should_save  # asked earlier in the step (on_step_begin ...): kept, as transformers
        super().on_step_end(args, state, control, **kwargs)
        control.should_save = saving or self.save_due()
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        saving = control.should_save  # save_strategy=epoch is grpokit's schedule too (save_due at the round's end)
        super().on_epoch_end(args, state, control, **kwargs)
        control.should_save = saving
        return control


class ProgressCallback(trainer_callback.ProgressCallback):
    """Stands for grpokit's console sink (its progress line and metrics), which replaces transformers' bar."""

    def __init__(self) -> None:
        self.training_bar = self.prediction_bar = None
        self.max_str_len = 100

    def on_train_begin(self, args, state, control, **kwargs):
        return None

    def on_step_end(self, args, state, control, **kwargs):
        return None

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        return None

    def on_evaluate(self, args, state, control, **kwargs):
        return None

    def on_log(self, args, state, control, logs=None, **kwargs):
        return None

    def on_train_end(self, args, state, control, **kwargs):
        return None


class _Tracker:
    """Hands each log entry to grpokit's sink of this tracker (``sink``, set once the run is built)."""

    sink_name = ""

    def __init__(self) -> None:
        self.sink: Any = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.sink is not None and state.is_world_process_zero and logs:
            self.sink.log_entry(logs, state.global_step)

    # the integration's own run setup, checkpoint uploads and closing are the sink's: none of them here
    def on_train_begin(self, args, state, control, **kwargs):
        return None

    def on_save(self, args, state, control, **kwargs):
        return None

    def on_push_begin(self, args, state, control, **kwargs):
        return None

    def on_train_end(self, args, state, control, **kwargs):
        return None

    def __del__(self) -> None:  # MLflowCallback's ends a run this object never started
        pass


# transformers' class names, so that a listing of the callbacks reads as TRL's
class TensorBoardCallback(_Tracker, integrations.TensorBoardCallback):
    sink_name = "tensorboard"


class WandbCallback(_Tracker, integrations.WandbCallback):
    sink_name = "wandb"


class MLflowCallback(_Tracker, integrations.MLflowCallback):
    sink_name = "mlflow"


class TrackioCallback(_Tracker, integrations.TrackioCallback):
    sink_name = "trackio"


TRACKERS = {t.sink_name: t for t in (TensorBoardCallback, WandbCallback, MLflowCallback, TrackioCallback)}


def with_defaults(args: Any, callbacks: list | None) -> list:
    """transformers' callback list as its CallbackHandler starts it: DefaultFlowCallback, the report_to trackers,
    ``callbacks``; its ``__init__`` then adds ``progress(args)`` through ``Trainer.add_callback``."""
    reports = [args.report_to] if isinstance(args.report_to, str) or args.report_to is None else args.report_to
    trackers = [TRACKERS[r]() for r in reports if r in TRACKERS]
    return [DefaultFlowCallback(), *trackers, *(callbacks or [])]


def progress(args: Any) -> type:
    """The class transformers' ``__init__`` passes to ``add_callback`` last: PrinterCallback with
    ``disable_tqdm``, else ProgressCallback."""
    return PrinterCallback if args.disable_tqdm else ProgressCallback


def sink_of(callback: Any) -> str | None:
    """The recorder sink a default callback stands for ("console", a tracker's name), None for the others."""
    if isinstance(callback, ProgressCallback):
        return "console"
    return callback.sink_name if isinstance(callback, _Tracker) else None


def resumed_at(callbacks: list, step: int) -> None:
    """A resumed run's trackers are fed log_history's entries from TRL's ``step`` on: TensorBoard's sink marks its
    restart there (trackers.TensorBoardSink.restart_at, which grpokit's loop set in its own steps)."""
    for cb in callbacks:
        if isinstance(cb, _Tracker) and getattr(cb.sink, "name", None) == "tensorboard":
            cb.sink.restart_at = step


class RoundsMuted:
    """A tracker sink whose per-round ``log`` from grpokit's loop is dropped: under grpokit.trl it is fed
    log_history's entries by its callback instead; samples, warnings and close pass through."""

    def __init__(self, sink: Any) -> None:
        self.sink, self.name = sink, sink.name

    def log(self, metrics, step: int) -> None:
        pass

    def log_samples(self, step: int, rows: list) -> None:
        self.sink.log_samples(step, rows)

    def warn(self, step: int, event: Any) -> None:
        self.sink.warn(step, event)

    def close(self) -> None:
        self.sink.close()
