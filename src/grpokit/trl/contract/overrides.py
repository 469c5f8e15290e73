"""A GRPOTrainer subclass's honoured overrides put in the slots of the stages they replace.

hooks.py decides which overrides are honoured; this module puts their adapters (stages.py,
generation.py) in grpokit's Trainer: ``runner`` (stage 3), ``rollout_func`` (stage 2),
``sample_and_score`` (stages 1-4), ``loss_stage`` (stage 5: grpokit's own until a loss override or
``loss_is_scaled_for_ga`` asks for TRL's) and its no-grad passes ``logprobs`` / ``old_logprobs``
(passes.py). grpokit's loop then calls them where it calls its own stages, with no branch of its own.
"""

from __future__ import annotations

from typing import Any

from grpokit.config.sections import ConfigError

from .generation import TrlGenerate, TrlSingleTurn
from .passes import TrlPasses
from .stages import NO_IMAGES, NO_TOP_K, TrlLoss, TrlRewards

SLOTTED = {"_calculate_rewards", "_generate_single_turn", "_tokenize_prompts", "_generate_and_score_completions"}
"""The honoured methods whose adapter is put in a stage's slot when the run is built (beside LOSS_HOOKS)."""
LOSS_HOOKS = {"compute_loss", "_compute_loss", "_get_per_token_logps_and_entropies", "_generate_and_score_completions"}


def into_slots(facade: Any, trainer: Any) -> None:
    """Reward functions called once per batch, as TRL; each honoured override in its stage's slot."""
    names = set(facade._overrides)
    for runner in {id(r): r for r in (trainer.runner, trainer.eval_runner)}.values():
        runner.whole_batch = True
    if "_calculate_rewards" in names:
        trainer.runner = TrlRewards(facade, trainer.runner)
    if samples(facade):
        trainer.rollout_func = TrlSingleTurn(facade)
    if "_generate_and_score_completions" in names:
        trainer.sample_and_score = TrlGenerate(facade, trainer)
    # the subclass's loss (and its generation batch) through TRL's loss path; without a loss override grpokit's
    # own stage, unless loss_is_scaled_for_ga is not True (TRL's loss path then divides, read at every slice)
    trainer.loss_stage = TrlLoss(facade, own=None if names & LOSS_HOOKS else trainer.loss_stage)
    # a loss override, or the flag (nearly always a class attribute) not True, already says TRL's loss path will
    # run: refused before step 1 samples, not at its first slice (TrlLoss still checks each slice for a flag
    # changed once the run is built)
    trl_loss = bool(names & LOSS_HOOKS) or facade.loss_is_scaled_for_ga is not True
    if trl_loss and any(p.vision is not None for p in trainer.prompts[:1]):
        raise ConfigError(NO_IMAGES)
    if trl_loss and trainer.cfg.algo.distill_top_k:
        raise ConfigError(NO_TOP_K)
    if "_get_per_token_logps_and_entropies" in names:  # pi_old and the reference through it too, as TRL's
        if trainer.replays_support:  # refused before the run starts: every step's pi_old pass would need it
            raise ConfigError(
                "a GRPOTrainer subclass's _get_per_token_logps_and_entropies cannot replay the sampler's truncated "
                "support (top_k / top_p / min_p with vLLM) that grpokit's pi_old pass needs; sample without "
                "truncation or drop the override"
            )
        passes = TrlPasses(facade, trainer)
        trainer.logprobs, trainer.old_logprobs = passes.logprobs, passes.old_logprobs


def samples(facade: Any) -> bool:
    """Whether the subclass's _generate_single_turn (or _tokenize_prompts) is stage 2; refused in one
    sentence where grpokit cannot call it as TRL would (tools, environments); a rollout_func wins, as in TRL."""
    if not {"_generate_single_turn", "_tokenize_prompts"} & set(facade._overrides):
        return False
    k = facade._kwargs
    if k["tools"] or k["environment_factory"]:
        raise ConfigError(
            "GRPOTrainer subclass overrides _generate_single_turn / _tokenize_prompts with tools or an "
            "environment_factory: grpokit's episode loop samples multi-turn episodes and cannot call them per turn"
        )
    return k["rollout_func"] is None


def init_end(callbacks: Any) -> None:
    """transformers' on_init_end, at the end of building: with the model and processing_class (the
    optimizer, schedule and loaders come with train(), as under transformers)."""
    objects = callbacks.objects
    later = {k: objects.get(k) for k in ("optimizer", "lr_scheduler", "train_dataloader")}
    objects.update(dict.fromkeys(later))
    callbacks("on_init_end")
    objects.update(later)
