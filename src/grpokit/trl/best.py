"""transformers' best-model tracking under grpokit.trl: ``metric_for_best_model``, ``greater_is_better``,
``load_best_model_at_end``, ``eval_delay``, and the checkpoint rotation that keeps the best checkpoint.

What transformers 5.24 does under TRL 1.16 (read from its Trainer, checked against it in
tests/trl/test_trl_run_management.py), and what this module repeats on grpokit's loop:

* after each evaluation run by ``eval_strategy`` (not ``eval_on_start``, not an ``evaluate()`` call),
  the metric (``eval_`` put in front when missing) is compared with ``state.best_metric`` (strictly
  greater with ``greater_is_better``, else strictly smaller); a new best records the step as
  ``state.best_global_step``;
* when a checkpoint is written, ``state.best_model_checkpoint`` becomes
  ``output_dir/checkpoint-<best_global_step>`` if that checkpoint exists (before trainer_state.json is
  written, so the file carries it); the rotation of ``save_total_limit`` never deletes it;
* when training ends, with ``load_best_model_at_end``, that checkpoint's weights are loaded into the
  model; with ``save_total_limit=1`` every other checkpoint is then deleted.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path
from typing import Any

from grpokit.config.sections import ConfigError

log = logging.getLogger("grpokit.trl")


def check_args(a: Any) -> None:
    """transformers' conditions for load_best_model_at_end, each refused in one sentence."""
    if not a.load_best_model_at_end:
        return
    if a.eval_strategy != a.save_strategy:
        raise ConfigError(
            f"GRPOConfig load_best_model_at_end=True needs eval_strategy and save_strategy to match, but they are "
            f"{a.eval_strategy!r} and {a.save_strategy!r}; set both to 'steps' or both to 'epoch'"
        )
    every = a.eval_steps or a.logging_steps
    if a.eval_strategy == "steps" and not _multiple(a.save_steps, every):
        raise ConfigError(
            f"GRPOConfig load_best_model_at_end=True needs save_steps to be a multiple of eval_steps, but save_steps="
            f"{a.save_steps} and eval_steps={every} (both whole steps, or both fractions of the run)"
        )


def _multiple(save: float, every: float) -> bool:
    if (save < 1) != (every < 1):  # a fraction and a step count: transformers refuses to guess
        return False
    return round(save * 1_000_000) % round(every * 1_000_000) == 0


def metric_key(a: Any) -> str | None:
    """The evaluation metric that ranks checkpoints: metric_for_best_model with the ``eval_`` prefix."""
    m = a.metric_for_best_model
    return None if m is None else m if m.startswith("eval_") else f"eval_{m}"


def update_best(state: Any, a: Any, metrics: dict[str, float]) -> bool:
    """After an evaluation by eval_strategy: record a new best metric and its step; True when it is one."""
    key = metric_key(a)
    if key is None:
        return False
    if key not in metrics:
        raise ConfigError(
            f"GRPOConfig metric_for_best_model={a.metric_for_best_model!r} names {key!r}, which the evaluation "
            f"does not return; use one of {sorted(k for k in metrics if k.startswith('eval_'))}"
        )
    greater = a.greater_is_better if a.greater_is_better is not None else not key.endswith("loss")
    value = float(metrics[key])
    if state.best_metric is None:
        state.best_metric = -math.inf if greater else math.inf
    if value > state.best_metric if greater else value < state.best_metric:  # NaN is never a new best
        state.best_metric = value
        if a.save_strategy in ("steps", "epoch"):  # transformers: any strategy that saves
            state.best_global_step = state.global_step
        return True
    return False


def note_checkpoint(state: Any, out_dir: Path, saved_steps: set[int]) -> None:
    """A checkpoint was just written: the best one becomes ``checkpoint-<best_global_step>`` if that step
    was saved (every rank decides alike, without looking at rank 0's files)."""
    if state.best_global_step and state.best_global_step in saved_steps:
        state.best_model_checkpoint = str(out_dir / f"checkpoint-{state.best_global_step}")


def kept_folder(state: Any, out_dir: Path) -> Path | None:
    """grpokit's checkpoint folder (checkpoints/step-N) the rotation must keep as the best, as of the
    checkpoint about to be written: ``checkpoint-<best_global_step>`` if it exists, else the last best."""
    candidates = [out_dir / f"checkpoint-{state.best_global_step}"] if state.best_global_step else []
    for link in candidates + ([Path(state.best_model_checkpoint)] if state.best_model_checkpoint else []):
        if link.exists():
            return link.resolve().parent  # checkpoint-N -> <run>/checkpoints/step-N/model
    return None


def finish(trainer: Any, state: Any, a: Any, main: bool) -> None:
    """When training ends, as transformers: load the best checkpoint's weights (load_best_model_at_end),
    then with save_total_limit=1 delete every checkpoint but the best (on the main process)."""
    if state.best_model_checkpoint is None:
        return
    if a.load_best_model_at_end:
        load_best(trainer, state)
    if a.save_total_limit == 1 and main:
        out, keep = Path(trainer.cfg.train.out), Path(state.best_model_checkpoint).resolve().parent
        for folder in (out / "checkpoints").glob("step-*"):
            if folder.resolve() != keep:
                shutil.rmtree(folder, ignore_errors=True)
        for link in out.glob("checkpoint-*"):
            if link.is_symlink() and not link.exists():
                link.unlink()


def load_best(trainer: Any, state: Any) -> None:
    """Load the weights of ``state.best_model_checkpoint`` into the internal trainer's model (LoRA
    adapters and FSDP shards through grpokit's checkpoint loaders), as transformers' _load_best_model."""
    from grpokit.train import checkpoint, checkpoint_hooks

    log.info("Loading best model from %s (score: %s).", state.best_model_checkpoint, state.best_metric)
    folder = Path(state.best_model_checkpoint).resolve().parent
    loaders = checkpoint_hooks.checkpoint_loaders(trainer.model, trainer.dist, trainer.cfg.model)
    checkpoint.load_model(folder, trainer.model, read_model=loaders.get("read_model"))
