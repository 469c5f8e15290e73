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
a step's updates, the step makes no further update.

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
    """What callbacks may ask of the loop (transformers' ``TrainerControl`` names)."""

    should_training_stop: bool = False
    """End the run after the current step."""


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

    def __init__(
        self, callbacks: list | None, args: Any, state: RunState, events: tuple[str, ...] | None = None, **objects: Any
    ):
        self.events = events or self.EVENTS  # the events this loop fires (grpokit.trl fires transformers' set)
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
        self.args, self.state, self.control, self.objects = args, state, Control(), objects

    def __call__(self, event: str, **kwargs: Any) -> Control:
        for cb in self.callbacks:
            method = getattr(cb, event, None)
            if callable(method):
                out = method(self.args, self.state, self.control, **self.objects, **kwargs)
                if out is not None and hasattr(out, "should_training_stop"):  # transformers returns control
                    self.control.should_training_stop = bool(out.should_training_stop)
        return self.control


def _user_defined(cb: Any, name: str) -> bool:
    """True when ``name`` is a method written for this callback, not transformers' inherited no-op."""
    owner = next((k for k in type(cb).__mro__ if name in vars(k)), None)
    return owner is not None and callable(getattr(cb, name)) and not owner.__module__.startswith("transformers.")
