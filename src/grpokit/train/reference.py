"""log pi_ref of a batch: the frozen reference copy (moved in from CPU when offloaded), or the
LoRA policy with its adapters disabled (the base), or with the adapter it started from in place of the
trained one (a run that starts from a trained adapter: lora.StartingAdapter).
"""

from __future__ import annotations

from typing import Callable

import torch

from . import lora


def reference_logprobs(
    model, ref_model, batch, logprobs: Callable, ref_adapter: lora.StartingAdapter | None = None
) -> torch.Tensor:
    """log pi_ref of the batch: the frozen copy ``ref_model``, or (LoRA, ``ref_model`` None) the policy
    ``model`` with the starting adapter ``ref_adapter`` in place, or without one with adapters disabled;
    ``logprobs(model, batch)`` is the loop's no-grad pass."""
    if ref_model is not None and getattr(ref_model, "grpokit_offloaded", False):  # on CPU between its passes
        ref_model.to(batch.input_ids.device)
        try:
            return logprobs(ref_model, batch)[0]
        finally:
            ref_model.to("cpu")
    if ref_model is not None:
        return logprobs(ref_model, batch)[0]
    if ref_adapter is not None:
        return ref_adapter.run(lambda: logprobs(model, batch)[0])
    return lora.reference_logprobs(model, lambda: logprobs(model, batch)[0])
