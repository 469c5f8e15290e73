"""Stage 5a's backbone pass: the final hidden states of the positions that predict completion tokens.

The policy's decoder stack runs once per batch; only the states that predict completion tokens are
kept (train/logprobs.py pushes them through the output layer a chunk at a time). The G completions of a
prompt share its tokens, so where the model family allows it the prompt runs once per distinct prompt
(``shared_prompts``). ``compile_backbone`` swaps in a ``torch.compile``d stack for these passes only.
"""

from __future__ import annotations

import weakref

import torch

from grpokit.nn.models import has_sliding_window
from grpokit.types import TokenBatch

_COMPILED: "weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module]" = weakref.WeakKeyDictionary()


def compile_backbone(model: torch.nn.Module, backend: str = "inductor", mode: str = "default") -> bool:
    """model.compile (TRL's torch_compile): this model's log-probability passes run its backbone through
    ``torch.compile`` (the same parameters; dynamic shapes). Sampling and other models stay eager.
    Returns False when the model has no backbone grpokit runs apart (see ``decoder_stack``)."""
    backbone = decoder_stack(model)
    if backbone is None:
        return False
    _COMPILED[model] = torch.compile(backbone, backend=backend, mode=None if mode == "default" else mode, dynamic=True)
    return True


def decoder_stack(model: torch.nn.Module) -> torch.nn.Module | None:
    """The decoder stack whose last hidden state feeds a plain linear head, or None (soft-capped
    logits, models without ``get_decoder``); compiled with model.compile."""
    if model in _COMPILED:
        return _COMPILED[model]
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or not hasattr(model, "get_decoder"):
        return None
    try:
        backbone = model.get_decoder()
    except (AttributeError, NotImplementedError):
        return None
    if backbone is None or backbone is model or model.get_output_embeddings() is None:
        return None
    return backbone


def completion_states(model: torch.nn.Module, batch: TokenBatch, share_prompts: bool) -> torch.Tensor | None:
    """Final hidden states ``(N, T, hidden)`` that predict the completion tokens (the state at
    position k predicts token k + 1), or None when the model has no plain linear head."""
    backbone = decoder_stack(model)
    if backbone is None:
        return None
    T = batch.width
    shared = shared_prompts(batch) if share_prompts and can_share_prompts(model, backbone) else None
    if shared is None:
        out = backbone(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
        return out.last_hidden_state[:, -T - 1 : -1]
    # Prompt sharing: the G completions of a prompt share its tokens, so the prompt runs once per
    # distinct prompt and its key/value cache is indexed out to every row that continues it. The
    # index is differentiable (its backward sums the rows' gradients into the shared prompt), so
    # values and gradients equal one forward over the repeated prompts up to float summation order.
    first, inverse = shared
    lp = batch.input_ids.shape[1] - T
    pre = backbone(
        input_ids=batch.input_ids[first, :lp],
        attention_mask=batch.attention_mask[first, :lp],
        position_ids=batch.position_ids[first, :lp],
        use_cache=True,
    )
    cache = pre.past_key_values
    cache.batch_select_indices(inverse)
    out = backbone(
        input_ids=batch.input_ids[:, lp:],
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids[:, lp:],
        past_key_values=cache,
        use_cache=True,
    )
    last_prompt_state = pre.last_hidden_state[:, -1:].index_select(0, inverse)  # predicts completion token 0
    return torch.cat([last_prompt_state, out.last_hidden_state[:, : T - 1]], dim=1)


# Decoder families whose forward accepts a plain ``DynamicCache`` that carries gradients (full
# attention in every layer); prompt sharing is checked against one whole forward in tests/train/test_logprobs.py.
PROMPT_SHARING_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def can_share_prompts(model: torch.nn.Module, backbone: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PROMPT_SHARING_TYPES:
        return False
    if has_sliding_window(config, backbone):
        return False
    # transformers turns the cache off inside activation-checkpointed layers
    on = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5 (PEFT forwards it)
    return not (on if on is not None else getattr(model, "is_gradient_checkpointing", False))


def shared_prompts(batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first, inverse)`` when rows repeat a prompt: ``first`` (U,) is one row per distinct prompt
    (tokens and padding), ``inverse`` (N,) the distinct prompt of each row. None when no prompt
    repeats (nothing to save) or there is no prompt part."""
    N, T = batch.completion_ids.shape
    lp = batch.input_ids.shape[1] - T
    if lp == 0 or N < 2:
        return None
    key = torch.cat([batch.input_ids[:, :lp], batch.attention_mask[:, :lp]], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    if uniq.shape[0] == N:
        return None
    rows = torch.arange(N, device=inverse.device)
    first = torch.full((uniq.shape[0],), N, dtype=torch.long, device=inverse.device).scatter_reduce(
        0, inverse, rows, "amin"
    )
    return first, inverse


def sharded(weight: torch.Tensor) -> bool:
    """True for an FSDP2 (DTensor) parameter: the model is sharded."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed tensors
        return False
    return isinstance(weight, DTensor)


def completion_logits(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """``(N, T, V)`` logits that predict the completion tokens from one whole forward: the way for
    models whose logits need more than a linear head on ``completion_states`` (soft-capped logits)."""
    return model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=batch.width + 1,
    ).logits[:, :-1]
