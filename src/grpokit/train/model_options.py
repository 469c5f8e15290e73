"""Model options that change the policy's forward pass (``model.*`` fields), each a small hook on the
loaded model:

* ``lm_head_fp32`` (ScaleRL, arXiv 2510.13786; TRL's ``cast_lm_head_to_fp32``): the output layer's
  weights and its logits in float32 while the rest of the model stays in ``model.dtype``. Its input
  is cast up and autocast is off inside it, so the logits are a float32 matmul of float32 weights.
  When the head is tied to the input embeddings the shared weight becomes float32 too, and the
  embeddings' output is cast back to the model's dtype (as TRL does; TRL's documentation says tied
  heads are unsupported, its code supports them).
* ``neftune_noise_alpha`` (NEFTune, Jain et al., arXiv 2310.05914; TRL's ``neftune_noise_alpha``):
  uniform noise in ``[-a, a]`` with ``a = alpha / sqrt(L * d)`` (L the forward's sequence length, d
  the hidden size; 1 for a decode step) added to the input embeddings. On while training
  (``noise_on``), off in evaluation; see ``noise_on`` for which passes get it. Sampling then runs
  without CUDA graphs (a captured graph would replay one noise draw).
* ``router_aux_loss_coef`` (Switch Transformer's load-balancing loss, which Mixture-of-Experts models
  in transformers return as ``aux_loss``): ``router_coefficient`` resolves it against the model; the
  update adds ``coef * aux_loss`` (update.py).
* ``disable_dropout`` (TRL's ``disable_dropout``): every dropout probability of the policy set to 0
  (``disable_dropout``). pi_old, the reference and the hf sampler's forward run in eval mode, the update in
  train mode; with dropout on, the ratio pi / pi_old is not 1 even before the first update of a batch, so
  the clip acts on dropout noise rather than on the policy's change.
"""

from __future__ import annotations

import contextlib
import math
import types

import torch

from grpokit.config.sections import ConfigError


def _float32_head_forward(self, hidden: torch.Tensor) -> torch.Tensor:
    # ScaleRL: logits from float32 weights and inputs; autocast would run the matmul in half precision
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        bias = None if self.bias is None else self.bias.float()
        return torch.nn.functional.linear(hidden.float(), self.weight.float(), bias)


def _cast_back(module, inputs, output):
    return output.to(module.grpokit_output_dtype)  # tied head: the embeddings keep feeding the model's dtype


def head_in_float32(model: torch.nn.Module) -> None:
    """The output layer of ``model`` in float32 (weights and logits); see the module docstring.
    The forward is bound to the instance, so ``copy.deepcopy`` (the reference policy) carries it."""
    head = model.get_output_embeddings()
    if head is None or not isinstance(head, torch.nn.Linear) or type(head).__module__.startswith("peft"):
        raise ConfigError(
            "model.lm_head_fp32 needs a plain linear output layer (lm_head) without a LoRA adapter on it; "
            "set model.lm_head_fp32=false or leave lm_head out of model.lora_target_modules"
        )
    embeddings = model.get_input_embeddings()
    tied = embeddings is not None and embeddings.weight is head.weight
    dtype = head.weight.dtype
    head.float()
    head.forward = types.MethodType(_float32_head_forward, head)
    if tied and dtype != torch.float32:
        embeddings.grpokit_output_dtype = dtype
        embeddings.register_forward_hook(_cast_back)


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout probability of ``model`` to 0 and return how many were not 0: torch's dropout modules
    (LoRA's adapters' included, and all TRL's ``disable_dropout`` sets) and the float attributes named
    ``*dropout`` that transformers' attention layers pass to their kernel in training mode
    (``attention_dropout``: a number, not a module). The model's config is left as it is, so a saved
    checkpoint keeps the model's own dropout settings."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            changed, module.p = changed + (module.p != 0), 0.0
        for name, value in list(vars(module).items()):  # e.g. LlamaAttention.attention_dropout
            if name.endswith("dropout") and isinstance(value, float):
                changed += value != 0.0
                setattr(module, name, 0.0)
    return changed


def _neftune_hook(module, inputs, output):
    if not getattr(module, "grpokit_neftune_on", False):
        return output
    length = output.size(-2) if output.dim() == 3 else 1  # the static decoder embeds one token per row: (n, d)
    bound = module.grpokit_neftune_alpha / math.sqrt(length * output.size(-1))  # NEFTune: alpha / sqrt(L d)
    return output + torch.zeros_like(output).uniform_(-bound, bound)


def add_neftune(model: torch.nn.Module, alpha: float) -> None:
    """Attach NEFTune's noise to ``model``'s input embeddings; it stays off until ``noise_on``."""
    embeddings = model.get_input_embeddings()
    embeddings.grpokit_neftune_alpha, embeddings.grpokit_neftune_on = float(alpha), False
    embeddings.register_forward_hook(_neftune_hook)


@contextlib.contextmanager
def noise_on(model: torch.nn.Module):
    """NEFTune noise on inside the block (a no-op for a model without it). The training step runs
    inside it whole (sampling with the hf backend, the old and LoRA-reference log-probabilities, the
    update), as TRL's GRPO does: transformers' hook fires whenever the model is in training mode,
    and TRL samples and takes those log-probabilities in training mode. Evaluation runs outside it."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is None or not hasattr(embeddings, "grpokit_neftune_alpha"):
        yield
        return
    embeddings.grpokit_neftune_on = True
    try:
        yield
    finally:
        embeddings.grpokit_neftune_on = False


def router_coefficient(model: torch.nn.Module, setting: float) -> float:
    """The weight of the MoE router loss for ``model.router_aux_loss_coef = setting``: 0 is off, -1 the
    model config's own ``router_aux_loss_coef`` (0 when it declares none, or the model has no router),
    a positive value itself. A positive value for a model that returns no router loss is refused."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    has_router = hasattr(config, "output_router_logits")
    if setting > 0 and not has_router:
        raise ConfigError(
            f"model.router_aux_loss_coef={setting} weighs a Mixture-of-Experts router loss, but "
            f"{type(model).__name__} returns none; set model.router_aux_loss_coef=0"
        )
    if not has_router:
        return 0.0
    return float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0) if setting < 0 else float(setting)
