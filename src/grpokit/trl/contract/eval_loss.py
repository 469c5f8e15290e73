"""``eval_loss`` through a subclass's loss override, as TRL's ``prediction_step`` computes it: the whole
eval batch as TRL's batch dict to ``trainer.compute_loss`` without gradient (so an override of
``compute_loss``, ``_compute_loss`` or ``_get_per_token_logps_and_entropies`` is the eval loss too).
An override of ``_generate_and_score_completions`` is refused for evaluate() in one sentence: grpokit's
evaluation samples and scores its eval batches itself."""

from __future__ import annotations

from typing import Any

import torch

from grpokit.config.sections import ConfigError

from .stages import batch_dict

LOSS = ("compute_loss", "_compute_loss", "_get_per_token_logps_and_entropies")


def refuse_generation_override(facade: Any) -> None:
    """One sentence when the subclass overrides _generate_and_score_completions and evaluate() would run."""
    if "_generate_and_score_completions" in facade._overrides:
        raise ConfigError(
            "GRPOTrainer subclass overrides _generate_and_score_completions, which grpokit.trl's evaluate() "
            "cannot call (its eval batches are sampled and scored by grpokit's stages, so the eval metrics would "
            "not follow the override); evaluate without it or set eval_strategy='no'"
        )


def loss_hook(facade: Any) -> Any:
    """``(model, batch, advantages, mask, ref_logp) -> loss`` through ``facade.compute_loss`` when the
    subclass overrides a loss hook, else None (grpokit's own eval loss)."""
    if not set(LOSS) & set(facade._overrides):
        return None

    @torch.no_grad()
    def loss_of(model, batch, advantages, mask, ref_logp) -> float:
        inputs = batch_dict(batch, advantages, mask, mask.sum().item())
        if ref_logp is not None:
            inputs["ref_per_token_logps"] = ref_logp
        loss = facade.compute_loss(model, inputs)  # as TRL's prediction_step: no num_items_in_batch keyword
        return float(loss.item())

    return loss_of
