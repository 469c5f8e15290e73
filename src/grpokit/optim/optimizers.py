"""Stage 6: the optimizer named by ``optim.optimizer``, built with the hyperparameters transformers'
Trainer gives it for the ``optim`` of the same name (transformers/trainer_optimizer.py; checked against
``Trainer.get_optimizer_cls_and_kwargs`` in tests/train/test_optimizer.py).

The parameters come in one group whose weight decay is ``optim.weight_decay`` (grpokit's default), or in
transformers' two groups, biases and norm weights undecayed (``optim.decay_norms_and_biases=false``, what
grpokit.trl sets; decay.py). Adafactor runs
on the external learning rate and the schedule, as the Trainer sets it up (no relative step, no
parameter scaling). The low-bit AdamW variants live in CUDA libraries that grpokit does not depend
on; naming one without its library installed is one sentence, before any work starts (validation).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Callable

import torch

from grpokit.config.base import ConfigError
from grpokit.config.optim import BNB_FIELDS, OptimConfig  # which fields each optimizer reads: config/optim.py

PACKAGES = {
    **dict.fromkeys(BNB_FIELDS, "bitsandbytes"),
    "adamw_torch_4bit": "torchao",
    "adamw_torch_8bit": "torchao",
}  # optimizer -> the package it needs


def missing_package(name: str) -> str | None:
    """One sentence when optimizer ``name`` needs a package this environment lacks, else None."""
    package = PACKAGES.get(name)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return (
        f"optim.optimizer={name!r} needs the {package} package, which is not installed "
        f"(a CUDA library: pip install {package} on a GPU machine), or choose adamw"
    )


def _adam_args(o: OptimConfig) -> dict:
    """The arguments every Adam-family optimizer takes from the optim section."""
    return dict(lr=o.lr, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps, weight_decay=o.weight_decay)


def _adamw(params: list, o: OptimConfig) -> torch.optim.Optimizer:
    # fused: one kernel over all parameters (CPU and CUDA); on a 33M-parameter model on CPU the step
    # takes ~26 ms instead of ~120 ms. Sharded (DTensor) parameters keep the default implementation.
    flat = [p for g in params for p in g["params"]] if params and isinstance(params[0], dict) else params
    fused = bool(flat) and all(
        p.device.type in ("cpu", "cuda") and p.is_floating_point() and type(p.data) is torch.Tensor for p in flat
    )
    return torch.optim.AdamW(
        params,
        **_adam_args(o),
        fused=fused or None,
    )


def _adafactor(params: list, o: OptimConfig) -> torch.optim.Optimizer:
    from transformers.optimization import Adafactor

    return Adafactor(params, lr=o.lr, scale_parameter=False, relative_step=False, weight_decay=o.weight_decay)


def _sgd(params: list, o: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        params, lr=o.lr, momentum=o.momentum, dampening=o.dampening, weight_decay=o.weight_decay, nesterov=o.nesterov
    )


def _adagrad(params: list, o: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.Adagrad(params, lr=o.lr, lr_decay=o.lr_decay, weight_decay=o.weight_decay, eps=o.eps or 1e-10)


def _rmsprop(params: list, o: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.RMSprop(
        params,
        lr=o.lr,
        alpha=o.rms_alpha,
        eps=o.eps or 1e-8,
        weight_decay=o.weight_decay,
        momentum=o.momentum,
        centered=o.centered,
    )


def _bitsandbytes(params: list, o: OptimConfig) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW, AdEMAMix, Lion or RMSprop as transformers builds each optim of that name: 8-bit
    state where the name says 8bit (else 32), paged where it starts with paged_ (RMSprop never)."""
    import bitsandbytes.optim as bnb  # classes looked up by name: only the one asked for must exist

    name = o.optimizer
    betas = (o.adam_beta1, o.adam_beta2)
    kind = next(k for k in ("ademamix", "lion", "rmsprop", "adamw") if k in name)
    cls, kw = {
        "adamw": ("AdamW", dict(betas=betas, eps=o.adam_eps)),
        "ademamix": (
            "AdEMAMix",
            dict(betas=(*betas, 0.9999), alpha=5.0, eps=o.adam_eps),
        ),  # transformers' beta3, alpha
        "lion": ("Lion", dict(betas=betas)),
        "rmsprop": ("RMSprop", {}),  # bitsandbytes' own alpha, eps, momentum (transformers passes none)
    }[kind]
    paged = {} if kind == "rmsprop" else {"is_paged": name.startswith("paged_")}
    return getattr(bnb, cls)(
        params, lr=o.lr, weight_decay=o.weight_decay, optim_bits=8 if "8bit" in name else 32, **kw, **paged
    )


def _torchao(params: list, o: OptimConfig) -> torch.optim.Optimizer:
    try:
        from torchao.optim import AdamW4bit, AdamW8bit
    except ImportError:  # torchao before 0.11 kept them here
        from torchao.prototype.low_bit_optim import AdamW4bit, AdamW8bit
    cls = AdamW4bit if o.optimizer == "adamw_torch_4bit" else AdamW8bit
    return cls(
        params,
        **_adam_args(o),
        block_size=256,
        bf16_stochastic_round=False,
    )


OPTIMIZERS: dict[str, Callable[[list, OptimConfig], torch.optim.Optimizer]] = {
    "adamw": _adamw,
    "adafactor": _adafactor,
    "sgd": _sgd,
    "adagrad": _adagrad,
    "rmsprop": _rmsprop,
    **dict.fromkeys(BNB_FIELDS, _bitsandbytes),
    "adamw_torch_4bit": _torchao,
    "adamw_torch_8bit": _torchao,
}


def build_optimizer(params: list, o: OptimConfig) -> Any:
    """``o.optimizer`` over ``params`` (tensors, or parameter groups: decay.py's ``param_groups``, whose
    weight decay wins over ``o.weight_decay``); a missing library is one sentence, not an ImportError."""
    problem = missing_package(o.optimizer)
    if problem is not None:
        raise ConfigError(problem)
    return OPTIMIZERS[o.optimizer](params, o)
