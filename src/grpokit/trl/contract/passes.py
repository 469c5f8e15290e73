"""The no-grad passes of stage 5 (pi_old, the reference) through a subclass's override of TRL's
``_get_per_token_logps_and_entropies``, as TRL computes its ``old_per_token_logps`` and
``ref_per_token_logps`` with that same method: an override shifting or reshaping the log-probabilities
changes all three alike (policy, pi_old, reference), so the ratio and the KL see it on both sides.
overrides.py puts ``TrlPasses`` in the Trainer's ``logprobs`` / ``old_logprobs`` slots."""

from __future__ import annotations

from typing import Any

import torch

from grpokit.config.sections import ConfigError


class TrlPasses:
    """``logprobs(model, batch, entropy)`` and ``old_logprobs(batch, entropy)`` with the Trainer's
    signatures, each a no-grad call of ``facade._get_per_token_logps_and_entropies`` (the subclass's)
    over the batch's rows, per_device_train_batch_size at a time (TRL's batch_size for these passes)."""

    def __init__(self, facade: Any, trainer: Any):
        self.facade, self.trainer = facade, trainer

    @torch.no_grad()
    def logprobs(self, model, batch, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        model.eval()
        if batch.vision is not None:
            raise ConfigError(
                "a GRPOTrainer subclass's _get_per_token_logps_and_entropies cannot be called with image inputs "
                "under grpokit.trl (TRL's pixel_values are not rebuilt); override it for text models"
            )
        L = batch.completion_ids.shape[1]
        with self.trainer.autocast():
            logps, ents, _ = self.facade._get_per_token_logps_and_entropies(
                model,
                batch.input_ids,
                batch.attention_mask,
                L,
                batch_size=self.facade.args.per_device_train_batch_size,
                compute_entropy=entropy,
            )
        return logps.float(), (ents.float() if entropy and ents is not None else None)

    def old_logprobs(self, batch, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        # a sampler's truncated support is refused when the passes are installed (overrides.into_slots)
        return (*self.logprobs(self.trainer.model, batch, entropy), None)
