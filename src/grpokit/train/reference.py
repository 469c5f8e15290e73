"""log pi_ref of a batch: the frozen reference copy (moved in from CPU when offloaded), or the
LoRA policy with its adapters disabled.
"""

from __future__ import annotations

from typing import Callable

import torch

from . import lora


def reference_logprobs(model, ref_model, batch, logprobs: Callable) -> torch.Tensor:
    """log pi_ref of the batch: the frozen copy ``ref_model``, or (LoRA, ``ref_model`` None) the
    policy ``model`` with adapters disabled; ``logprobs(model, batch)`` is the loop's no-grad pass."""
    if ref_model is not None and getattr(ref_model, "grpokit_offloaded", False):  # on CPU between its passes
        ref_model.to(batch.input_ids.device)
        try:
            return logprobs(ref_model, batch)[0]
        finally:
            ref_model.to("cpu")
    if ref_model is not None:
        return logprobs(ref_model, batch)[0]
    return lora.reference_logprobs(model, lambda: logprobs(model, batch)[0])
