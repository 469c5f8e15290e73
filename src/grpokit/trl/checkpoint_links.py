"""TRL's checkpoint folders on grpokit's checkpoints, and their pushes to the Hub.

grpokit writes the whole run state to ``output_dir/checkpoints/step-N``; TRL's scripts look for
``output_dir/checkpoint-N`` (N counted in TRL's steps) holding the model and ``trainer_state.json``.
``name_checkpoint`` makes that folder a link to grpokit's model folder; ``HubPush`` is the callback
of ``hub_strategy="every_save"``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from . import best
from .inputs import HubPushError, push_folder

log = logging.getLogger("grpokit.trl")
TRAINING_ARGS = "training_args.bin"  # transformers' TRAINING_ARGS_NAME


def name_checkpoint(
    path: Path, step: int, out: Path, state, saved_steps: set[int], is_main: bool, args: Any = None
) -> None:
    """TRL's ``out/checkpoint-<step>``: a link to grpokit's checkpoint model folder ``path/model``, with
    TRL's trainer_state.json (``state``) and transformers' training_args.bin (``args`` pickled by torch.save,
    as transformers' ``_save``) in it; links whose checkpoint was rotated away are removed.
    ``saved_steps`` (the TRL steps with a checkpoint) gets ``step``."""
    saved_steps.add(step)
    best.note_checkpoint(
        state, out, saved_steps
    )  # every rank (all load the best at the end), before trainer_state.json
    if not is_main or not (path / "model").is_dir():
        return
    link = out / f"checkpoint-{step}"
    if link.is_symlink() or link.exists():
        link.unlink()
    # relative (checkpoints/step-N/model): the links still lead to their checkpoints when output_dir is moved
    link.symlink_to(os.path.relpath(path.resolve() / "model", out.resolve()), target_is_directory=True)
    state.save_to_json(str(path / "model" / "trainer_state.json"))
    save_args(args, path / "model")
    for old in out.glob("checkpoint-*"):
        if old.is_symlink() and not old.exists():
            old.unlink()


def save_args(args: Any, folder: Path) -> None:
    """transformers' ``training_args.bin`` in ``folder``: the arguments object, ``torch.save``d (None: nothing)."""
    if args is not None:
        import torch

        torch.save(args, folder / TRAINING_ARGS)


class HubPush:
    """hub_strategy every_save: each checkpoint's model goes to the Hub when it is written. A failed
    push of a checkpoint is logged and training goes on (the checkpoint is on disk)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def on_save(self, args, state, control, checkpoint=None, **kwargs):
        if checkpoint is not None and state.is_world_process_zero:
            try:
                push_folder(
                    Path(checkpoint) / "model",
                    self.trainer.hub_model_id,
                    f"Training in progress, step {state.global_step}",
                    args.hub_token,
                    args.hub_private_repo,
                    args.hub_revision,
                )
            except HubPushError as e:
                log.warning("%s", e)
