"""``model.kernels``: liger-kernel's fused Triton kernels in the policy's own layers.

A Hugging Face decoder layer runs its RMSNorm as about seven elementwise kernels (a float32 copy,
square, mean, rsqrt, two products, a cast back), its SwiGLU as two (SiLU, product) and its rotary
embedding as five, each a full pass over the layer's activations, again in the recomputation of
activation checkpointing and again in the backward pass. An H100 profile of one 0.5B update spent
1.5 of its 4.9 GPU seconds in such products and copies (bench/RESULTS.md). liger-kernel
(Hsu et al., arXiv 2410.10989; TRL's ``use_liger_kernel`` loads it the same way) replaces each with
one Triton kernel forward and one backward, computing in float32 as the originals do; results
agree with the originals to the rounding of the model's dtype, not bit for bit.

Applied to the loaded policy before anything copies it, so the reference model and the static
decoding engine (which calls the layers' norms) use them too. liger-kernel patches per model family
(llama, qwen2, qwen3, mistral, gemma ... its ``MODEL_TYPE_TO_APPLY_LIGER_FN``) and, for the family,
transformers' module-level classes and rotary function as well; grpokit keeps that to the policy
(nn/liger_scope.py): the classes are put back and the function calls liger's kernel on CUDA tensors
only, so a model of the family built later (a reward model, a CPU run in the same process) computes
as without liger. Its fused output-layer losses stay off: grpokit's own head
(train/head.py) computes the log-probabilities.
"""

from __future__ import annotations

import inspect

import torch

from grpokit.config.sections import ConfigError
from grpokit.nn import liger_scope
from grpokit.rollout.static import unwrapped

KERNELS = {"rms_norm": True, "swiglu": True, "rope": True, "cross_entropy": False, "fused_linear_cross_entropy": False}


def unavailable(model: torch.nn.Module, device: torch.device) -> str | None:
    """Why liger-kernel cannot run this model here, or None when it can."""
    if device.type != "cuda":
        return f"needs a CUDA device (its kernels are Triton GPU kernels); this run's device is {device.type}"
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as e:
        return f"needs the liger-kernel package (pip install liger-kernel), which does not import here: {e}"
    model_type = getattr(getattr(unwrapped(model), "config", None), "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        known = ", ".join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))
        return f"has no kernels for model type {model_type!r} (it patches: {known})"
    return None


def apply_kernels(mode: str, model: torch.nn.Module, device: torch.device) -> bool:
    """Patch ``model`` with liger-kernel's kernels as ``mode`` asks; returns whether it did.
    "liger" refuses with the reason when it cannot, "auto" then keeps the model's own code."""
    if mode == "torch":
        return False
    reason = unavailable(model, device)
    if reason is not None:
        if mode == "liger":
            raise ConfigError(f"model.kernels='liger' {reason}; set model.kernels=torch (the model's own code) or auto")
        return False
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    base = unwrapped(model)  # a LoRA policy is patched in its base model
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN[base.config.model_type]
    accepted = inspect.signature(apply).parameters
    try:
        # its rebinding of transformers' classes and functions kept to this policy (nn/liger_scope.py)
        liger_scope.scoped(lambda: apply(model=base, **{k: v for k, v in KERNELS.items() if k in accepted}))
    except Exception as e:  # a liger release that does not fit this transformers: auto keeps the model's code
        if mode == "liger":
            raise
        print(f"grpokit: model.kernels=auto: liger-kernel could not patch this model ({e!r}); its own code runs")
        return False
    return True
