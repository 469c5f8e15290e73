"""The methods of TRL's GRPOTrainer that grpokit.trl's GRPOTrainer carries beside its own (a mixin of it).

Every method TRL 1.16's GRPOTrainer defines exists here or in trainer.py with TRL's signature, so a
subclass calling one directly or through ``super()`` finds it. Those grpokit carries out compute what
TRL's compute (the reward logs, the prompts' tokens, VESPO's weights); those that belong to TRL's own
machinery (its DataLoader, its generation and tool loops, its training step) stop in one sentence
saying what grpokit does instead. Overriding one is honoured or refused by hooks.py.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grpokit.config.sections import ConfigError

from .hooks import REFUSED
from .surface import high_entropy_mask


def unavailable(name: str) -> ConfigError:
    """The one sentence a call of TRL machinery grpokit does not have gets."""
    return ConfigError(f"GRPOTrainer.{name} is TRL's own machinery, which grpokit.trl does not run: {REFUSED[name]}")


class TrlMethods:
    """TRL's GRPOTrainer methods; the GRPOTrainer supplies ``_metrics``, ``_logs``, ``_pending_metrics``,
    ``processing_class`` and ``_get()``."""

    loss_is_scaled_for_ga: bool | None = True
    """TRL's class attribute (transformers' Trainer reads it in training_step): True, TRL's loss divides itself
    for gradient accumulation; a subclass whose compute_loss returns a per-micro-batch loss sets it False (or
    None: transformers' own rule) and its loss is divided by the update's micro-batches (stages.TrlLoss)."""

    # ---- reward functions' logging keywords (TRL passes these as log_extra / log_metric)
    def _log_completion_extra(self, column: str, values: list) -> None:
        """TRL's ``log_extra``: one value per completion of the batch, a column of the completions table."""
        self._logs["extra"][column].extend(values)

    def _log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric``: a scalar averaged into the next log entry under ``name``."""
        self._pending_metrics.setdefault(name, []).append(float(value))

    def _tokenize_prompts(self, prompts: list):
        """TRL's: ``(prompt_ids, images, multimodal_fields)``; chat-message prompts go through the chat
        template with the generation prompt and chat_template_kwargs, as TRL renders them, text prompts are
        tokenized as written (text prompts only)."""
        tok, kw = self.processing_class, dict(self.chat_template_kwargs or {})
        if prompts and isinstance(prompts[0], list):
            texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True, **kw) for p in prompts]
            ids = tok(text=texts, add_special_tokens=False)["input_ids"]
        else:
            ids = tok(text=prompts)["input_ids"]
        return ids, None, {}

    @staticmethod
    def get_gamma_weights(
        advantages: torch.Tensor,
        log_ratio_per_token: torch.Tensor,
        mask: torch.Tensor,
        importance_sampling_ratio: torch.Tensor | None,
        k_pos: float = 2.0,
        lambda_pos: float = 3.0,
        k_neg: float = 3.0,
        lambda_neg: float = 2.0,
    ) -> torch.Tensor:
        """TRL's VESPO weight (B, 1): phi(w) = e^lambda w^k e^(-lambda w) of the sequence ratio w (with the
        sampler's correction), k and lambda by the advantage's sign (grpokit/algo/vespo.py's gamma_weight)."""
        from grpokit.algo.vespo import gamma_weight

        log_w = (log_ratio_per_token.clamp(-20.0, 20.0) * mask).sum(dim=-1, keepdim=True)  # (B, 1)
        if importance_sampling_ratio is not None:
            log_w = log_w + importance_sampling_ratio.log().clamp(math.log(1e-8), 20.0).sum(dim=-1, keepdim=True)
        adv = advantages if advantages.dim() == 2 else advantages[:, None]
        return gamma_weight(
            log_w.clamp(math.log(1e-8), 20.0).exp(), adv.expand_as(log_w), (k_pos, lambda_pos), (k_neg, lambda_neg)
        )

    # ---- TRL's machinery that grpokit's loop replaces: callable, each stops in one sentence
    def _set_signature_columns_if_needed(self):
        raise unavailable("_set_signature_columns_if_needed")

    def get_train_dataloader(self):
        raise unavailable("get_train_dataloader")

    def _get_train_sampler(self, dataset: Any = None):
        raise unavailable("_get_train_sampler")

    def _get_eval_sampler(self, eval_dataset):
        raise unavailable("_get_eval_sampler")

    def get_eval_dataloader(self, eval_dataset: Any = None):
        raise unavailable("get_eval_dataloader")

    def training_step(self, model, inputs, num_items_in_batch):
        raise unavailable("training_step")

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        raise unavailable("_prepare_inputs")

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's: ``(completion_ids, logprobs)``, one completion per row of ``prompt_ids``, sampled by
        grpokit's engine (text prompts; grpokit/trl/contract/generation.py)."""
        if images is not None or multimodal_fields:
            raise unavailable("_generate_single_turn")
        from .generation import generate_single_turn

        return generate_single_turn(self, prompt_ids, num_generations)

    def _get_tool_suffix_ids(self, tool_messages):
        raise unavailable("_get_tool_suffix_ids")

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        raise unavailable("_tool_call_loop")

    def _generate(self, prompts: list):
        raise unavailable("_generate")

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's: sample the rows' prompts (each repeated num_generations times), score them, and return
        TRL's batch dict (prompt_ids, completion_ids, their masks, advantages, num_items_in_batch and the
        log-probabilities the loss needs); grpokit/trl/contract/generation.py."""
        from .generation import generate_and_score

        return generate_and_score(self, inputs)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys: list[str] | None = None):
        raise unavailable("prediction_step")

    def _save_checkpoint(self, model, trial):
        raise unavailable("_save_checkpoint")

    def _load_optimizer_and_scheduler(self, checkpoint):
        raise unavailable("_load_optimizer_and_scheduler")

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's: the ``(N, num_reward_funcs)`` rewards of N completions, each reward function called once
        over the batch with TRL's keywords (NaN where it returned None); grpokit/trl/contract/stages.py."""
        from .stages import calculate_rewards

        return calculate_rewards(self, inputs, prompts, completions, completion_ids_list)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's: the loss of one micro-batch (TRL's batch dict), already scaled for gradient accumulation."""
        if return_outputs:
            raise ValueError("The GRPOTrainer does not support returning outputs")  # TRL's words
        return self._compute_loss(model, inputs)

    def _compute_loss(self, model, inputs):
        """TRL's: the policy loss of TRL's batch dict, by grpokit's objective (grpokit/trl/contract/stages.py)."""
        from .stages import compute_loss

        return compute_loss(self, model, inputs)

    # ---- transformers' callback list (TRL's GRPOTrainer inherits it)
    def add_callback(self, callback: Any) -> None:
        """Add a callback (an object or a class, which is instantiated), as transformers' ``Trainer.add_callback``;
        construction adds PrinterCallback or ProgressCallback through it, as transformers' ``__init__``."""
        callback = callback() if isinstance(callback, type) else callback
        self._callbacks.append(callback)
        if self.bridge is not None:
            self.bridge.user.callbacks.append(callback)

    def pop_callback(self, callback: Any) -> Any:
        """Remove and return the first callback that is ``callback`` or an instance of that class (None: none),
        transformers' defaults too (DefaultFlowCallback, TensorBoardCallback ..., PrinterCallback or
        ProgressCallback: default_callbacks.py): what a removed one stands for stops with it."""
        found = None
        for where in ([self.bridge.user.callbacks] if self.bridge is not None else []) + [self._callbacks]:
            match = next(
                (
                    cb
                    for cb in where
                    if cb is callback or (isinstance(callback, type) and (cb is callback or isinstance(cb, callback)))
                ),
                None,
            )
            if match is not None:
                where.remove(match)
                found = found or match
        if found is not None:
            self._drop_sink(found)  # the tracker or console it stood for, once the run is built
        return found

    def remove_callback(self, callback: Any) -> None:
        """Remove a callback (an object or a class), as transformers' ``Trainer.remove_callback``."""
        self.pop_callback(callback)

    # ---- TRL's masks, for a script or a compute_loss override that calls them
    def get_high_entropy_mask(self, entropies, mask, threshold: float):
        """TRL's: True where a real token's entropy is at or above the ``threshold`` quantile of the real tokens."""
        return high_entropy_mask(entropies, mask, threshold)

    @staticmethod
    def get_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold: float):
        """TRL's: (N, 1) float, 0 for sequences with negative advantage whose mean log-ratio to the sampler
        exceeds the threshold (DeepSeek-V3.2), else 1."""
        from grpokit.algo.masks import offpolicy_sequences

        adv = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(per_token_logps)
        masked = offpolicy_sequences(per_token_logps, sampling_per_token_logps, adv, mask, off_policy_threshold)
        return (~masked).to(per_token_logps.dtype)[:, None]
