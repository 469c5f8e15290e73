"""What TRL lets a subclass or a user assign on the trainer after construction, honoured.

TRL's GRPOTrainer holds ``model``, ``processing_class``, ``reward_funcs`` and ``ref_model`` as plain
attributes, and projects replace them after ``super().__init__`` (a teacher as ``ref_model``, a model
wrapped or swapped, a scorer list rebuilt). grpokit's run is built from them (the optimizer holds the
model's parameters, the sampler the model and tokenizer, the reward stage the functions), so an
assignment before ``train()`` starts rebuilds the run from the new object: a run built but not trained
is let go (its folder's lock released, its workers closed) and built anew on first use, so the object
assigned is the one trained, sampled with and called. Once training started, assigning ``model``,
``processing_class`` or ``reward_funcs`` is refused in one sentence (the optimizer and sampler hold
the old ones). ``ref_model`` is read by the loop at every step, so it is assigned as is, at any time.
"""

from __future__ import annotations

from typing import Any

from grpokit.config.sections import ConfigError

RUN_INPUTS = {"model": "model", "processing_class": "tokenizer", "reward_funcs": "reward_funcs"}
"""TRL's attribute -> the grpokit Trainer argument it is built from."""


def assign(facade: Any, name: str, value: Any) -> None:
    """``facade.<name> = value`` (one of ``RUN_INPUTS``): kept for the run's build, the built run let go
    when it has not trained yet, refused in one sentence once training started."""
    if facade._started:
        raise ConfigError(
            f"GRPOTrainer.{name} can be replaced until train() starts; during or after training the run's "
            f"optimizer and sampler keep the {name} they were built with"
        )
    if facade._trainer is not None:
        let_go(facade._trainer)
        facade._trainer, facade.bridge = None, None
    facade._kwargs[RUN_INPUTS[name]] = value


def let_go(trainer: Any) -> None:
    """A built grpokit Trainer that never trained: its workers, sampler and recorder closed, its run folder's
    lock released, so a new one can be built in the same folder."""
    for part in (trainer.runner, trainer.eval_runner, trainer.engine, trainer.recorder):
        part.close()
    trainer._release_lock()
