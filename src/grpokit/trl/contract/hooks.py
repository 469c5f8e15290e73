"""TRL's extension contract: which overridden method of a GRPOTrainer subclass grpokit calls, and where.

Research built on TRL ships as a subclass of its ``GRPOTrainer`` that overrides a method or two
(how rewards are computed, the loss ...). grpokit.trl runs grpokit's loop, so an override is either
*honoured* (grpokit calls it at TRL's point with TRL's inputs and uses its result: it becomes the
stage it replaces) or *refused* at construction in one sentence naming it. Never silently ignored:
``check`` walks every method TRL's GRPOTrainer and transformers' Trainer define (``trl_method_names``;
a static list of TRL 1.16's own when trl is not installed), so a method this table does not know is
refused too. ``HONOURED`` says where each honoured one runs; ``REFUSED`` why the others cannot be.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from grpokit.config.sections import ConfigError

log = logging.getLogger("grpokit.trl")

# TRL 1.16's GRPOTrainer's own methods (used when trl is not installed; trl's class is read when it is)
TRL_METHODS = (
    "__init__ _set_signature_columns_if_needed get_train_dataloader _get_train_sampler _get_eval_sampler "
    "get_eval_dataloader get_high_entropy_mask _get_per_token_logps_and_entropies training_step _prepare_inputs "
    "_log_completion_extra _log_metric _calculate_rewards _tokenize_prompts _generate_single_turn "
    "_get_tool_suffix_ids _tool_call_loop _generate _generate_and_score_completions compute_loss "
    "get_off_policy_mask get_gamma_weights _compute_loss prediction_step log _save_checkpoint "
    "_load_optimizer_and_scheduler"
).split()

HONOURED: dict[str, str] = {
    "__init__": "construction: a subclass's __init__ runs as under TRL (call super().__init__ with TRL's arguments)",
    "train": "called by the script; grpokit's loop runs inside it",
    "evaluate": "called at TRL's eval steps (eval_strategy, eval_on_start) and by the script",
    "log": "every log entry of training and evaluation goes through it (super().log writes log_history, on_log)",
    "_calculate_rewards": "the reward stage (3): called once per generation batch with TRL's inputs; its "
    "(N, num_reward_funcs) tensor is the rewards, weighted into the advantages (train and evaluate)",
    "compute_loss": "the loss stage (5): called per micro-batch of per_device_train_batch_size rows with TRL's "
    "batch dict; the loss it returns (scaled for gradient accumulation, as TRL's) is the one back-propagated",
    "_compute_loss": "the loss stage (5), through compute_loss",
    "_get_per_token_logps_and_entropies": "the loss stage's log-probabilities (5), through _compute_loss",
    "_generate_and_score_completions": "stages 1-4 (once per generation batch, with TRL's rows): super() samples "
    "and scores through grpokit's stages; the dict it returns is what the loss stage trains on",
    "_generate_single_turn": "the sampling stage (2) of one-turn runs: called once per generation batch with "
    "TRL's prompt_ids (one row per completion, from _tokenize_prompts); its completions are the rollout",
    "_tokenize_prompts": "the prompts' tokens _generate_single_turn receives (when that is overridden)",
    "push_to_hub": "called by the script and at the end of train() (push_to_hub=True)",
    "log_metrics": "called by the script",
    "save_metrics": "called by the script",
    "save_state": "called by the script",
    "create_model_card": "called by the script",
    "add_callback": "called by the script",
    "pop_callback": "called by the script",
    "remove_callback": "called by the script",
    "end": "called by the script",
}
"""Overridable methods grpokit calls at TRL's point with TRL's inputs, and where."""

_LOOP = "grpokit's loop, which does not call it"
REFUSED: dict[str, str] = {
    "_log_metric": "reward functions get grpokit's reward runner's log_metric, whose values reach the logs",
    "_log_completion_extra": "reward functions get grpokit's reward runner's log_extra, whose columns reach the "
    "completions table",
    "save_model": "transformers calls it for every checkpoint; grpokit's checkpoints are its own run state",
    "_generate": "sampling (stage 2) is grpokit's engine; pass rollout_func= to replace it",
    "_tool_call_loop": "grpokit's episode loop runs tools= and environment_factory=, not TRL's tool loop",
    "_get_tool_suffix_ids": "grpokit's episode loop runs tools= and environment_factory=, not TRL's tool loop",
    "_prepare_inputs": "grpokit's loop samples and slices each generation batch itself; override compute_loss "
    "to see each micro-batch",
    "training_step": "the update is grpokit's (accumulation, clipping, the optimizer step); override compute_loss "
    "to change the loss",
    "get_high_entropy_mask": "grpokit's loss computes top_entropy_quantile's mask itself; override compute_loss",
    "get_off_policy_mask": "grpokit's loss computes off_policy_mask_threshold's mask itself; override compute_loss",
    "get_gamma_weights": "grpokit's loss computes VESPO's weights itself; override compute_loss",
    "prediction_step": "evaluate() scores sampled completions as TRL's evaluation loss; override evaluate",
    "_save_checkpoint": "checkpoints are grpokit's run state; use a callback's on_save",
    "_load_optimizer_and_scheduler": "resuming restores grpokit's own checkpoint",
    "get_train_dataloader": "grpokit samples prompts without a DataLoader",
    "get_eval_dataloader": "grpokit samples prompts without a DataLoader",
    "_get_train_sampler": "grpokit samples prompts without a DataLoader (seed and shuffle_dataset set the order)",
    "_get_eval_sampler": "grpokit samples prompts without a DataLoader",
    "_set_signature_columns_if_needed": "grpokit passes every dataset column to the reward functions",
    "create_optimizer": "the optimizer is built from GRPOConfig (optim, learning_rate, weight_decay, adam_* ...); "
    "set them there",
    "create_scheduler": "the schedule is built from GRPOConfig (lr_scheduler_type, warmup_* ...); set them there",
    "create_optimizer_and_scheduler": "the optimizer and schedule are built from GRPOConfig; set them there",
}
"""Overridable methods grpokit cannot call where TRL does, with the reason and what to do instead."""


@functools.lru_cache(maxsize=1)
def trl_method_names() -> tuple[str, ...]:
    """Every method of TRL's GRPOTrainer, with those it inherits from transformers' Trainer (public ones
    and the underscored ones subclasses override), or TRL 1.16's own list when trl is not installed."""
    names = set(TRL_METHODS)
    try:
        from trl import GRPOTrainer as Trl
    except ImportError:
        from transformers import Trainer as Trl
    for name in dir(Trl):
        if name.startswith("__") and name != "__init__":
            continue
        if callable(inspect.getattr_static(Trl, name, None)) or isinstance(
            inspect.getattr_static(Trl, name, None), (staticmethod, classmethod)
        ):
            names.add(name)
    return tuple(sorted(names))


def recorded(cls: type) -> type:
    """Class decorator: keep ``cls``'s own attribute table (grpokit.trl's GRPOTrainer as defined) as
    ``_own_methods``, so a method patched on the class itself later (``GRPOTrainer._calculate_rewards = f``,
    as patching scripts do) is found as an override, the same as a subclass's."""
    table = {name: inspect.getattr_static(cls, name) for name in dir(cls)}
    cls._own_methods = table["_own_methods"] = MappingProxyType(table)
    return cls


def overridden(cls: type, own: Mapping[str, Any]) -> list[str]:
    """The TRL / transformers methods that ``cls`` (grpokit's GRPOTrainer, a subclass of it, or either with a
    method patched on the class) holds in place of grpokit's own (``own``: ``recorded``'s table), by name."""
    changed = {name for name in dir(cls) if inspect.getattr_static(cls, name, None) is not own.get(name)}
    if not changed:  # grpokit.trl's own class as defined: nothing to look up (and trl is not imported for it)
        return []
    return [name for name in trl_method_names() if name in changed]


def _who(cls: type, name: str) -> str:
    """How a refusal names where the method came from: a subclass's override or a patch of grpokit's class."""
    owner = next((c for c in cls.__mro__ if name in vars(c)), cls)
    if "_own_methods" in vars(owner):
        return f"GRPOTrainer has {name} patched on the class"
    return f"GRPOTrainer subclass overrides {name}"


def refusal(name: str, who: str = "") -> str:
    """The one sentence refusing an override of ``name`` (``who``: what holds it; a subclass by default)."""
    why = REFUSED.get(name, f"it is transformers' Trainer machinery that {_LOOP}")
    return (
        f"{who or f'GRPOTrainer subclass overrides {name}'}, which grpokit.trl cannot call where TRL does ({why}); "
        "the override would never run, so it is refused"
    )


def check(cls: type, own: Mapping[str, Any], quiet: bool = False) -> list[str]:
    """Refuse (ConfigError) the first override grpokit cannot honour; return the honoured ones and log
    once where each runs (``quiet``: not again)."""
    names = overridden(cls, own)
    for name in names:
        if name not in HONOURED:
            raise ConfigError(refusal(name, _who(cls, name)))
    stages = [n for n in names if n != "__init__"]
    if stages and not quiet:
        log.warning(
            "%s: these stages follow its overrides: %s",
            "GRPOTrainer (methods patched on the class)"
            if "_own_methods" in vars(cls)
            else f"GRPOTrainer subclass {cls.__name__}",
            "; ".join(f"{n} -> {HONOURED[n]}" for n in stages),
        )
    return names


def honours(trainer: Any, name: str) -> bool:
    """Whether ``trainer``'s class overrides ``name`` (an honoured method)."""
    return name in getattr(trainer, "_overrides", ())
