"""transformers' stateful callbacks in grpokit.trl's checkpoints.

A callback that is an ``ExportableState`` (EarlyStoppingCallback ...) has its ``state()`` written to
trainer_state.json's ``stateful_callbacks`` by class name, beside the loop's ``TrainerControl``, at
construction and with each checkpoint, as transformers writes them. With
``restore_callback_states_from_checkpoint`` a resumed run rebuilds each callback whose class name the
checkpoint holds from that state (``type(cb)(**args)``, then its attributes) and moves it to the end of
the callbacks, as transformers' ``_load_callback_state`` does. Two callbacks of one class are stored as a
list of their states at the save (transformers appends at every save and restores the first ones: the
states of its construction; here each restored callback gets its own state at the checkpoint).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from transformers import TrainerControl
from transformers.trainer_callback import ExportableState

log = logging.getLogger("grpokit.trl")


def export(state: Any, callbacks: list, control: TrainerControl) -> None:
    """``state.stateful_callbacks``: each ExportableState callback's ``state()`` by class name (a list for
    several of one class), then ``control``'s."""
    out: dict[str, Any] = {}
    for cb in [*callbacks, control]:
        if isinstance(cb, ExportableState):
            name = type(cb).__name__
            if name in out:
                out[name] = (out[name] if isinstance(out[name], list) else [out[name]]) + [cb.state()]
            else:
                out[name] = cb.state()
    state.stateful_callbacks = out


def at_init(state: Any, callbacks: list) -> None:
    """The states transformers' Trainer.__init__ puts in its TrainerState (a control with no flag set)."""
    export(state, callbacks, TrainerControl())


def at_save(state: Any, callbacks: list, stop: bool) -> None:
    """The states a checkpoint holds: transformers saves while its control asks to save (and to stop, at the
    last step or when a callback asked), after logging and evaluating reset those flags."""
    export(state, callbacks, TrainerControl(should_save=True, should_training_stop=stop))


def restore(state: Any, callbacks: list, checkpoint: Path) -> None:
    """Rebuild, in ``callbacks``, each callback whose class name ``checkpoint``'s trainer_state.json holds
    under stateful_callbacks (TrainerControl's flags are not: transformers resets them at on_train_begin);
    ``state.stateful_callbacks`` becomes the stored states, as transformers loads them."""
    saved = checkpoint / "trainer_state.json"
    stored = (json.loads(saved.read_text()).get("stateful_callbacks") if saved.exists() else None) or {}
    state.stateful_callbacks = stored
    not_found = []
    for name, data in stored.items():
        if name == "TrainerControl":
            continue
        same = [cb for cb in callbacks if type(cb).__name__ == name]
        if not same:
            not_found.append(name)
            continue
        for cb, kept in zip(same, data if isinstance(data, list) else [data]):
            new = type(cb)(**kept.get("args", {}))
            for attribute, value in kept.get("attributes", {}).items():
                setattr(new, attribute, value)
            callbacks.remove(cb)
            callbacks.append(new)
    if not_found:
        log.warning(
            "the checkpoint holds the states of callbacks this run does not have; ignored: %s", ", ".join(not_found)
        )
