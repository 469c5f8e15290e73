"""The optimizer and learning-rate schedule section (stage 6), in a file of its own because it carries
every optimizer's and every schedule's options: each is read only by the optimizer or schedule its
docstring names (optim/optimizers.py, optim/schedule.py), and validation refuses one set away from its
default where nothing reads it. The names and meanings are transformers', so a TRL script's
``optim``, ``lr_scheduler_type`` and ``lr_scheduler_kwargs`` map onto them one to one (docs/TRL.md)."""

from __future__ import annotations

from .base import section

ADAM_FIELDS = ("adam_beta1", "adam_beta2", "adam_eps")
BNB_FIELDS = {  # bitsandbytes optimizer -> the optim fields it reads beyond lr and weight_decay
    "adamw_8bit": ADAM_FIELDS,
    "paged_adamw_8bit": ADAM_FIELDS,
    "paged_adamw_32bit": ADAM_FIELDS,
    "ademamix": ADAM_FIELDS,
    "ademamix_8bit": ADAM_FIELDS,
    "paged_ademamix_32bit": ADAM_FIELDS,
    "paged_ademamix_8bit": ADAM_FIELDS,
    "lion_32bit": ("adam_beta1", "adam_beta2"),
    "lion_8bit": ("adam_beta1", "adam_beta2"),
    "paged_lion_32bit": ("adam_beta1", "adam_beta2"),
    "paged_lion_8bit": ("adam_beta1", "adam_beta2"),
    "rmsprop_bnb": (),
    "rmsprop_bnb_8bit": (),
    "rmsprop_bnb_32bit": (),
}
OPTIMIZER_FIELDS: dict[str, tuple[str, ...]] = {  # the optim fields (beyond lr and weight_decay) each optimizer reads
    "adamw": ADAM_FIELDS,
    "adafactor": (),
    "sgd": ("momentum", "dampening", "nesterov"),
    "adagrad": ("lr_decay", "eps"),
    "rmsprop": ("momentum", "rms_alpha", "eps", "centered"),
    **BNB_FIELDS,
    "adamw_torch_4bit": ADAM_FIELDS,
    "adamw_torch_8bit": ADAM_FIELDS,
}
"""Which optim fields each optimizer reads (optim/optimizers.py builds them so; a table here, in the config layer,
so that validation refuses the others and a preset leaves them unset: ``unread_optimizer_fields``)."""
LAMBDA_ADAM = ("adam_beta1", "adam_beta2")
"""What lambda-GRPO's own Adam reads of the optim section, whatever the optimizer (algo/stage_state.py)."""


def unread_optimizer_fields(optimizer: str, aggregation: str) -> list[str]:
    """The optimizers' fields that ``optimizer`` does not read (none for a name not in the table), less the betas
    under ``aggregation`` (algo.aggregation) lambda-grpo, whose own Adam reads them: the one rule validation refuses
    by and a preset fills by. Example: "sgd" -> adam_beta1 ... centered; "sgd" beside lambda-grpo: adam_eps ..."""
    reads = set(OPTIMIZER_FIELDS.get(optimizer, [n for names in OPTIMIZER_FIELDS.values() for n in names]))
    reads |= set(LAMBDA_ADAM) if aggregation == "lambda-grpo" else set()
    return sorted({n for names in OPTIMIZER_FIELDS.values() for n in names} - reads)


@section
class OptimConfig:
    optimizer: str = "adamw"
    """"adamw" (torch's AdamW, fused where it can be), "adafactor" (transformers' Adafactor driven by `lr` and the
    schedule, as transformers' Trainer builds it), "sgd", "adagrad", "rmsprop" (torch's), or a low-bit AdamW from a CUDA
    library: "adamw_8bit", "paged_adamw_8bit" and bitsandbytes' others under transformers' optim names
    ("paged_adamw_32bit", "ademamix", "lion_8bit", "rmsprop_bnb" ...: BNB_FIELDS below),
    "adamw_torch_4bit", "adamw_torch_8bit" (torchao)."""
    lr: float = 1e-6
    """Peak learning rate (1e-6, TRL's and DeepSeekMath's, suits LLMs; the tiny demo model uses 3e-4)."""
    weight_decay: float = 0.0
    """Weight decay (AdamW and Adafactor: decoupled; sgd, adagrad, rmsprop: added to the gradient)."""
    decay_norms_and_biases: bool = True
    """Whether weight_decay reaches biases and norm weights too (true: one group of every parameter). false:
    transformers' Trainer's two groups, parameters inside a LayerNorm or named bias / norm (RMSNorm weights)
    undecayed (optim/decay.py); grpokit.trl sets false, as TRL, when it decays. Refused with weight_decay=0."""
    adam_beta1: float = 0.9
    """AdamW beta1 (and of the other Adam-family optimizers; lambda-GRPO's own Adam too). Refused with an
    optimizer that does not read it (sgd, adafactor ...)."""
    adam_beta2: float = 0.99
    """AdamW beta2 (as adam_beta1)."""
    adam_eps: float = 1e-8
    """AdamW epsilon (the Adam-family optimizers'; refused with the others)."""
    momentum: float = 0.0
    """sgd and rmsprop: momentum factor (0: none)."""
    dampening: float = 0.0
    """sgd: dampening of the momentum."""
    nesterov: bool = False
    """sgd: Nesterov momentum (needs momentum > 0 and dampening 0)."""
    lr_decay: float = 0.0
    """adagrad: learning-rate decay (the step's rate is lr / (1 + (t - 1) * lr_decay))."""
    rms_alpha: float = 0.99
    """rmsprop: smoothing constant of the running average of squared gradients."""
    centered: bool = False
    """rmsprop: divide by the gradient's estimated variance instead of its second moment."""
    eps: float = 0.0
    """adagrad and rmsprop: the epsilon added to the denominator (0: torch's default, 1e-10 for adagrad, 1e-8 for
    rmsprop)."""
    warmup_steps: int = 0
    """Warm-up updates: the rate rises linearly from 0 at the first update to `lr` after this many, as in transformers
    (warmup_stable_decay: from min_lr_rate * lr, shaped by warmup_type)."""
    schedule: str = "constant"
    """Learning-rate schedule over the updates after warm-up, transformers' of the same name: "constant" (transformers'
    constant_with_warmup), "linear" and "cosine" (to 0 at the last update), "cosine_with_min_lr" (cosine to min_lr_rate
    * lr), "cosine_warmup_with_min_lr" (the same with warmup_lr_rate's warm-up), "cosine_with_restarts", "polynomial",
    "inverse_sqrt" or "warmup_stable_decay"."""
    schedule_steps: int = 0
    """Updates the schedule spans, transformers' num_training_steps (0: all the run's optimizer updates, train.steps *
    algo.num_iterations * train.updates_per_batch)."""
    num_cycles: float = 0.5
    """cosine, cosine_with_min_lr, cosine_warmup_with_min_lr and warmup_stable_decay's cosine decay: cosine waves over
    the decay (0.5: half a wave, from lr down to the floor)."""
    restart_cycles: float = 1.0
    """cosine_with_restarts: how many cosine decays from lr to 0 the updates after warm-up hold, each after the first
    starting again at lr (transformers' num_cycles of that schedule; 1: no restart)."""
    min_lr_rate: float = 0.0
    """The floor as a fraction of lr: where cosine_with_min_lr and cosine_warmup_with_min_lr end, and where
    warmup_stable_decay starts its warm-up and ends its decay (its min_lr_ratio)."""
    warmup_lr_rate: float = -1.0
    """cosine_warmup_with_min_lr: the first update's rate as a fraction of lr, rising linearly to lr at the last warm-up
    update (-1: transformers' None, (step + 1) / warmup_steps)."""
    power: float = 1.0
    """polynomial: exponent of the decay from lr to lr_end (1: linear)."""
    lr_end: float = 1e-7
    """polynomial: the rate at the last update and after; must be below lr."""
    timescale: int = 0
    """inverse_sqrt: after warm-up the rate is lr / sqrt((step + timescale - warmup_steps) / timescale) (0:
    warmup_steps, or 10000 without warm-up, as transformers)."""
    num_decay_steps: int = 0
    """warmup_stable_decay: updates of the final decay to min_lr_rate * lr."""
    num_stable_steps: int = -1
    """warmup_stable_decay: updates at lr between warm-up and decay (-1: the rest, schedule steps - warmup_steps -
    num_decay_steps)."""
    warmup_type: str = "linear"
    """warmup_stable_decay: shape of the warm-up, "linear", "cosine" or "1-sqrt"."""
    decay_type: str = "cosine"
    """warmup_stable_decay: shape of the decay, "linear", "cosine" or "1-sqrt"."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value (0 = no clipping)."""
