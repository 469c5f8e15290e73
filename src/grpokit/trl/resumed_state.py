"""What a resumed GRPOTrainer's ``state`` takes from its checkpoint's trainer_state.json, as transformers.

transformers' ``Trainer._init_training_state`` replaces its fresh ``TrainerState`` by the checkpoint's whole
(``TrainerState.load_from_json``), then sets again what belongs to the run starting now: ``max_steps``,
``num_train_epochs`` and the process flags; a ``best_model_checkpoint`` whose folder is gone is dropped with a
warning. So ``log_history`` holds the entries up to the checkpoint, ``num_input_tokens_seen`` (TRL's running
``num_tokens``), ``total_flos``, ``epoch`` and the best-model record continue. Departure: the logging, eval and
save periods (and ``train_batch_size``) stay the running run's, which grpokit's loop schedules by, where
transformers keeps the checkpoint's with a warning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("grpokit.trl")

KEPT = ("max_steps", "num_train_epochs", "is_local_process_zero", "is_world_process_zero")
"""Set by the run starting now (transformers' init_training_references)."""
OWN_PERIODS = ("logging_steps", "eval_steps", "save_steps", "train_batch_size")
"""The running run's: grpokit's loop logs, evaluates and saves by them (a departure, see the module docstring)."""


def restored(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """The state fields a resume ends with: ``saved`` (the checkpoint's trainer_state.json) but for
    KEPT and OWN_PERIODS, which stay ``now``'s; fields ``now`` lacks are left out. ``stateful_callbacks``
    stay ``now``'s too (callback_states.restore takes them with restore_callback_states_from_checkpoint)."""
    keep = {*KEPT, *OWN_PERIODS, "stateful_callbacks"}
    return {k: (now[k] if k in keep else saved.get(k, now[k])) for k in now}


def restore(state: Any, checkpoint: Path) -> None:
    """``state`` (transformers' TrainerState) continued from ``checkpoint/trainer_state.json`` (see ``restored``).
    A checkpoint without one (written by ``grpokit train``, not grpokit.trl) is said once: the weights, optimizer
    and step carry over, the log history and token count start empty (transformers starts a fresh state too)."""
    saved_file = Path(checkpoint) / "trainer_state.json"
    if not saved_file.exists():
        log.warning(
            "%s holds no trainer_state.json (not a grpokit.trl checkpoint): resuming at global_step %d with an empty "
            "log_history and num_tokens counted from 0",
            checkpoint,
            state.global_step,
        )
        return
    saved = json.loads(saved_file.read_text())
    for key, value in restored(saved, vars(state)).items():
        setattr(state, key, value)
    best = state.best_model_checkpoint
    if best is not None and not Path(best).is_dir():  # transformers' words
        log.warning(
            "The best checkpoint %s recorded in the resumed state does not exist anymore. Ignoring it for this run.",
            best,
        )
        state.best_model_checkpoint = None
