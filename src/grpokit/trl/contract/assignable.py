"""What TRL lets a subclass or a user assign on the trainer after construction, honoured.

TRL's GRPOTrainer holds ``model``, ``processing_class``, ``reward_funcs`` and ``ref_model`` as plain
attributes, and projects replace them after ``super().__init__`` (a teacher as ``ref_model``, a model
wrapped or swapped, a scorer list rebuilt). grpokit's run is built from them (the optimizer holds the
model's parameters, the sampler the model and tokenizer, the reward stage the functions), so an
assignment before ``train()`` starts rebuilds the run from the new object: a run built but not trained
is let go (its folder's lock released, its workers closed) and built anew on first use, so the object
assigned is the one trained, sampled with and called (``train_dataset`` too: trainer_attributes.py). Once
training started, assigning ``model`` or ``processing_class`` is refused in one sentence (the optimizer and
sampler hold the old ones); ``reward_funcs`` is then the next batch's (held_rewards.py). ``ref_model`` is read
by the loop at every step, so it is assigned as is, at any time. A TRL method patched on the instance, or on
the class after construction (``class_patches``), is followed as a subclass's override would be, or refused.
"""

from __future__ import annotations

from typing import Any

from grpokit.config.sections import ConfigError

INERT = (
    "vllm_generation async_loop async_loop_thread async_loop_ready_event commit_scheduler continuous_batching_config "
    "_dist _image_pad_token_id _video_pad_token_id _entropy_window_stats environments chat_template"
).split()
"""What TRL holds for machinery grpokit does not run (attributes.init_state sets them None); a value set on one
is refused (set_attribute)."""

RUN_INPUTS = {
    "model": "model",
    "processing_class": "tokenizer",
    "reward_funcs": "reward_funcs",
    "rollout_func": "rollout_func",
}
"""TRL's attribute -> the grpokit Trainer argument it is built from."""


def assign(facade: Any, name: str, value: Any) -> None:
    """``facade.<name> = value`` (one of ``RUN_INPUTS``): kept for the run's build, the built run let go
    when it has not trained yet, refused in one sentence once training started."""
    if facade._started:
        raise ConfigError(
            f"GRPOTrainer.{name} can be replaced until train() starts; during or after training the run's "
            f"optimizer and sampler keep the {name} they were built with"
        )
    rebuild(facade)
    facade._kwargs[RUN_INPUTS[name]] = value


def rebuild(facade: Any) -> None:
    """The run is built anew at its next use: a built one that never trained is let go (``let_go``). Every change
    of what a run is built from before train() (a replaced input, a patched method, a new train_dataset) goes
    through here."""
    if facade._trainer is not None:
        let_go(facade._trainer)
        facade._trainer, facade.bridge = None, None


def let_go(trainer: Any) -> None:
    """A built grpokit Trainer that never trained: its workers, sampler and recorder closed, its run folder's
    lock released, so a new one can be built in the same folder."""
    for part in (trainer.runner, trainer.eval_runner, trainer.engine, trainer.recorder):
        part.close()
    trainer._release_lock()


def set_rollout_func(facade: Any, value: Any) -> None:
    """``facade.rollout_func = fn``: at construction TRL's argument; afterwards the run's stage 2 replaced as
    ``model`` is (a built, untrained run built anew; refused in one sentence once training started)."""
    if "_rollout_func" in vars(facade):
        from ..trainer_args import trl_rollout_func

        assign(facade, "rollout_func", trl_rollout_func(value, facade))
    facade._rollout_func = value


ROLLOUT_FUNC = property(lambda self: self._rollout_func, set_rollout_func, doc="TRL's: the rollout function.")


def set_attribute(facade: Any, name: str, value: Any) -> None:
    """What ``facade.<name> = value`` means beyond a plain attribute: a callable under one of TRL's or
    transformers' method names (a method patched on the instance) honoured as a subclass's override of it
    (the run built anew when built but untrained) or refused in one sentence as the override would be;
    machinery TRL holds but grpokit does not run (``INERT``, ``chat_template``) refused when set."""
    from . import hooks

    if name in INERT and value is not None and "_overrides" in vars(facade):
        raise ConfigError(
            f"GRPOTrainer.{name} is TRL machinery grpokit.trl does not read, so assigning it would change nothing"
            + (
                "; set the template on the tokenizer (processing_class.chat_template) before constructing the trainer"
                if name == "chat_template"
                else ""
            )
        )
    if not callable(value) or name == "__init__" or "_overrides" not in vars(facade):
        return
    if name not in hooks.trl_method_names():
        return
    if name not in hooks.HONOURED:
        raise ConfigError(hooks.refusal(name, f"GRPOTrainer instance has a patched {name}"))
    from .overrides import LOSS_HOOKS, SLOTTED

    if name in facade._overrides or name not in SLOTTED | LOSS_HOOKS:  # found on the instance where it is called
        return
    if facade._started:
        raise ConfigError(f"GRPOTrainer.{name} can be patched until train() starts; the run's stages are built")
    rebuild(facade)
    facade._overrides = [*facade._overrides, name]


def class_patches(facade: Any) -> None:
    """Methods patched on the class (``GRPOTrainer._calculate_rewards = f``) since the trainer was constructed:
    an honoured one is followed as a subclass's override would be (a built, untrained run built anew), a
    refused one is refused in the same sentence; once training started, a new one is refused."""
    from . import hooks

    added = [n for n in hooks.check(type(facade), facade._own_methods, quiet=True) if n not in facade._overrides]
    if not added:
        return
    if facade._started:
        raise ConfigError(
            f"GRPOTrainer.{added[0]} was patched on the class after train() started; the run's stages are built "
            "(patch it before the first train())"
        )
    rebuild(facade)
    facade._overrides = [*facade._overrides, *added]
