"""Trainer callbacks at fixed points of the loop, with the signature of transformers' ``TrainerCallback``.

A callback is any object with some of these methods (a ``transformers.TrainerCallback`` works as is;
a class is instantiated, as transformers does):

    on_train_begin(args, state, control, **kw)      before anything else (before the evaluation before training)
    on_step_begin(args, state, control, **kw)       before each step's sampling; state.global_step is the previous step
    on_update_begin(args, state, control, **kw)     before each optimizer update's first slice (a step makes
                                                    num_iterations x updates_per_batch of them)
    on_pre_optimizer_step(args, state, control, **kw) before each update's optimizer step (gradients complete)
    on_optimizer_step(args, state, control, metrics, **kw) after each of the step's num_iterations updates
    on_step_end(args, state, control, metrics, **kw) after each step's update; state.global_step is that step
    on_evaluate(args, state, control, metrics, **kw) after each held-out evaluation (before, during, after)
    on_log(args, state, control, logs, **kw)        with the step's metrics, when they are written
    on_save(args, state, control, **kw)             after a checkpoint is complete on disk
    on_train_end(args, state, control, **kw)        once, after the final evaluation

``args`` is what the run was configured with (a grpokit ``Config``, or the ``GRPOConfig`` of the
TRL-compatible layer); the keywords are ``model``, ``processing_class``, ``optimizer``,
``lr_scheduler`` (and ``metrics`` / ``logs``). Setting ``control.should_training_stop = True``
ends the run after the current step (checkpoint, evaluation and report still happen); set after one of
a step's updates, the step makes no further update. ``control.should_save`` and
``control.should_evaluate`` are what the step will do after ``on_step_end``, as in transformers: the loop
clears them at ``on_step_begin`` and sets them before ``on_step_end`` when ``train.save_every`` /
``train.eval_every`` (or the last step) asks; a callback may set them either way (the final evaluation of
the run summary happens anyway). Any other attribute (transformers' ``should_log``, ``should_epoch_stop``)
is refused in one sentence: grpokit records every step and has no epoch loop to stop.

``RunState`` is also what reward functions receive as ``trainer_state`` (TRL passes the
transformers ``TrainerState``; the fields here carry the same names).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunState:
    """The run's progress, under transformers' ``TrainerState`` names."""

    global_step: int = 0
    """Steps done (one step: a batch sampled, scored and trained on)."""
    max_steps: int = 0
    """Steps the run is configured for."""
    epoch: float = 0.0
    """Passes over the training prompts so far (prompts served / number of prompts)."""
    log_history: list[dict[str, Any]] = field(default_factory=list)
    """Every logged metrics dict with its "step" and "epoch", in order (as transformers keeps it)."""
    is_world_process_zero: bool = True
    """True on the process that writes (rank 0)."""

    def light(self) -> RunState:
        """A copy without the log history: what reward functions get (it may travel to a worker)."""
        return dataclasses.replace(self, log_history=[])


@dataclass
class Control:
    """What callbacks may ask of the loop (transformers' ``TrainerControl`` names); other names are refused."""

    should_training_stop: bool = False
    """End the run after the current step."""
    should_save: bool = False
    """Write a checkpoint after the current step."""
    should_evaluate: bool = False
    """Evaluate on the held-out prompts after the current step."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _CONTROL_FLAGS:
            why = _NOT_READ.get(name, "grpokit's loop reads no such flag")
            raise AttributeError(
                f"control.{name} is not a flag of grpokit's Control ({why}); its flags are {', '.join(_CONTROL_FLAGS)}"
            )
        object.__setattr__(self, name, value)


_CONTROL_FLAGS = ("should_training_stop", "should_save", "should_evaluate")
_NOT_READ = {
    "should_log": "grpokit writes every step's metrics, so there is no log to ask for or skip",
    "should_epoch_stop": "grpokit's loop has no epoch loop to cut short; should_training_stop ends the run",
}


class Callbacks:
    """Calls every callback's ``on_<event>`` method that exists, in the order given."""

    EVENTS = (
        "on_train_begin",
        "on_step_begin",
        "on_update_begin",
        "on_pre_optimizer_step",
        "on_optimizer_step",
        "on_step_end",
        "on_evaluate",
        "on_log",
        "on_save",
        "on_train_end",
    )

    RESETS: dict[str, tuple[str, ...]] = {"on_step_begin": ("should_save", "should_evaluate")}
    """Flags cleared before an event's callbacks run (transformers' CallbackHandler clears them so)."""

    def __init__(
        self,
        callbacks: list | None,
        args: Any,
        state: RunState,
        events: tuple[str, ...] | None = None,
        control: Any = None,
        resets: dict[str, tuple[str, ...]] | None = None,
        **objects: Any,
    ):
        self.events = events or self.EVENTS  # the events this loop fires (grpokit.trl fires transformers' set)
        self.resets = self.RESETS if resets is None else resets
        self.callbacks = [cb() if isinstance(cb, type) else cb for cb in (callbacks or [])]
        for cb in self.callbacks:
            if not any(callable(getattr(cb, e, None)) for e in self.events):
                raise TypeError(
                    f"callback {cb!r} has none of the methods {', '.join(self.events)}; "
                    "pass a transformers TrainerCallback or an object with some of them"
                )
            never = [n for n in dir(type(cb)) if n.startswith("on_") and n not in self.events and _user_defined(cb, n)]
            if never:  # e.g. on_epoch_end: code there would silently never run
                raise TypeError(
                    f"callback {type(cb).__name__} defines {', '.join(never)}, which grpokit never calls; "
                    f"move that code to one of {', '.join(self.events)}"
                )
        self.args, self.state, self.objects = args, state, objects
        self.control = Control() if control is None else control

    def __call__(self, event: str, **kwargs: Any) -> Control:
        for flag in self.resets.get(event, ()):
            setattr(self.control, flag, False)
        for cb in self.callbacks:
            method = getattr(cb, event, None)
            if callable(method):
                out = method(self.args, self.state, self.control, **self.objects, **kwargs)
                if out is not None and out is not self.control:  # transformers: a returned control replaces it
                    for flag in (f.name for f in dataclasses.fields(self.control)):
                        if hasattr(out, flag):
                            setattr(self.control, flag, bool(getattr(out, flag)))
        return self.control


def _user_defined(cb: Any, name: str) -> bool:
    """True when ``name`` is a method written for this callback, not transformers' inherited no-op."""
    owner = next((k for k in type(cb).__mro__ if name in vars(k)), None)
    return owner is not None and callable(getattr(cb, name)) and not owner.__module__.startswith("transformers.")
