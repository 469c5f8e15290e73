"""Stage 6: the learning-rate schedule, a multiplier of ``optim.lr`` for each optimizer update.

Every schedule is transformers' of the same name (transformers/optimization.py), so a TRL script's
``lr_scheduler_type`` and ``lr_scheduler_kwargs`` give the same rate at every update (checked against
``transformers.get_scheduler`` in tests/train/test_schedule.py). Two conventions follow from that:

* the warm-up starts at 0: update ``s < warmup_steps`` runs at ``s / warmup_steps`` of lr, so the first
  update of a warmed-up run changes only the optimizer's moments;
* grpokit's "constant" is transformers' constant_with_warmup (transformers' plain "constant" ignores
  warmup_steps; the TRL layer maps it to warmup 0).

``step`` counts the updates already made (0 for the first); ``total`` is the schedule's length
(``optim.schedule_steps``, else all the run's updates).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from grpokit.config.optim import OptimConfig


def _warm(step: int, warmup: int) -> float:
    return float(step) / float(max(1, warmup))


def _progress(step: int, warmup: int, total: int) -> float:
    return float(step - warmup) / float(max(1, total - warmup))


def _constant(step: int, o: OptimConfig, total: int) -> float:
    return _warm(step, o.warmup_steps) if step < o.warmup_steps else 1.0


def _linear(step: int, o: OptimConfig, total: int) -> float:
    if step < o.warmup_steps:
        return _warm(step, o.warmup_steps)
    return max(0.0, float(total - step) / float(max(1, total - o.warmup_steps)))


def _cosine_floor(step: int, o: OptimConfig, total: int, floor: float) -> float:
    """num_cycles cosine waves after warm-up, between 1 and ``floor``."""
    if step < o.warmup_steps:
        return _warm(step, o.warmup_steps)
    wave = 0.5 * (1.0 + math.cos(math.pi * float(o.num_cycles) * 2.0 * _progress(step, o.warmup_steps, total)))
    return max(0.0, wave * (1 - floor) + floor)


def _cosine(step: int, o: OptimConfig, total: int) -> float:
    return _cosine_floor(step, o, total, 0.0)


def _cosine_with_min_lr(step: int, o: OptimConfig, total: int) -> float:
    return _cosine_floor(step, o, total, o.min_lr_rate)


def _cosine_warmup_with_min_lr(step: int, o: OptimConfig, total: int) -> float:
    """transformers' variant: the warm-up starts above 0 and the decay's first update is already past its peak."""
    cur, warm = float(step), float(o.warmup_steps)
    if cur < warm:
        if o.warmup_lr_rate < 0:  # transformers' warmup_lr_rate None
            return (cur + 1.0) / max(1.0, warm)
        start = float(o.warmup_lr_rate)
        return start + (1.0 - start) * cur / max(1, warm - 1)
    progress = (cur - warm + 1.0) / max(1.0, float(total) - warm)
    wave = 0.5 * (1.0 + math.cos(math.pi * o.num_cycles * 2.0 * progress))
    return max(0.0, wave * (1 - o.min_lr_rate) + o.min_lr_rate)


def _cosine_with_restarts(step: int, o: OptimConfig, total: int) -> float:
    if step < o.warmup_steps:
        return _warm(step, o.warmup_steps)
    progress = _progress(step, o.warmup_steps, total)
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(o.restart_cycles) * progress) % 1.0))))


def _polynomial(step: int, o: OptimConfig, total: int) -> float:
    """(lr - lr_end) * remaining ** power + lr_end, as a multiplier of lr; lr_end / lr past the end."""
    if step < o.warmup_steps:
        return _warm(step, o.warmup_steps)
    if step > total:
        return o.lr_end / o.lr
    remaining = 1 - (step - o.warmup_steps) / max(
        1, total - o.warmup_steps
    )  # transformers divides by 0 when total = warmup
    return ((o.lr - o.lr_end) * remaining**o.power + o.lr_end) / o.lr


def _inverse_sqrt(step: int, o: OptimConfig, total: int) -> float:
    timescale = o.timescale or o.warmup_steps or 10_000
    if step < o.warmup_steps:
        return _warm(step, o.warmup_steps)
    return 1.0 / math.sqrt((step + timescale - o.warmup_steps) / timescale)


_RISE = {
    "linear": lambda p: p,
    "cosine": lambda p: 0.5 * (1.0 - math.cos(math.pi * p)),
    "1-sqrt": lambda p: 1.0 - math.sqrt(1.0 - p),
}
_FALL = {
    "linear": lambda p, cycles: 1.0 - p,
    "cosine": lambda p, cycles: 0.5 * (1.0 + math.cos(math.pi * float(cycles) * 2.0 * p)),
    "1-sqrt": lambda p, cycles: 1.0 - math.sqrt(p),
}
WSD_SHAPES = tuple(_RISE)


def _warmup_stable_decay(step: int, o: OptimConfig, total: int) -> float:
    """Warm-up from min_lr_rate to 1, lr for num_stable_steps, decay to min_lr_rate, then min_lr_rate."""
    warm, decay, floor = o.warmup_steps, o.num_decay_steps, o.min_lr_rate
    stable = o.num_stable_steps if o.num_stable_steps >= 0 else total - warm - decay
    if step < warm:
        return max(0.0, _RISE[o.warmup_type](_warm(step, warm)) * (1.0 - floor) + floor)
    if step < warm + stable:
        return 1.0
    if step < warm + stable + decay:
        progress = float(step - warm - stable) / float(max(1, decay))
        return max(0.0, _FALL[o.decay_type](progress, o.num_cycles) * (1.0 - floor) + floor)
    return floor


SCHEDULES: dict[str, Callable[[int, OptimConfig, int], float]] = {
    "constant": _constant,
    "linear": _linear,
    "cosine": _cosine,
    "cosine_with_min_lr": _cosine_with_min_lr,
    "cosine_warmup_with_min_lr": _cosine_warmup_with_min_lr,
    "cosine_with_restarts": _cosine_with_restarts,
    "polynomial": _polynomial,
    "inverse_sqrt": _inverse_sqrt,
    "warmup_stable_decay": _warmup_stable_decay,
}
SCHEDULE_FIELDS: dict[str, tuple[str, ...]] = {  # the optim fields (beyond lr and warmup_steps) each schedule reads
    "constant": (),
    "linear": (),
    "cosine": ("num_cycles",),
    "cosine_with_min_lr": ("num_cycles", "min_lr_rate"),
    "cosine_warmup_with_min_lr": ("num_cycles", "min_lr_rate", "warmup_lr_rate"),
    "cosine_with_restarts": ("restart_cycles",),
    "polynomial": ("power", "lr_end"),
    "inverse_sqrt": ("timescale",),
    "warmup_stable_decay": (
        "num_decay_steps",
        "num_stable_steps",
        "warmup_type",
        "decay_type",
        "min_lr_rate",
        "num_cycles",
    ),
}


def lr_factor(step: int, o: OptimConfig, total: int) -> float:
    """The multiplier of ``o.lr`` for the update after ``step`` updates of a ``total``-update schedule."""
    return SCHEDULES[o.schedule](step, o, total)


def make_scheduler(
    optimizer: torch.optim.Optimizer, o: OptimConfig, run_updates: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over ``optimizer`` stepped once per update; its length is ``o.schedule_steps`` or ``run_updates``."""
    total = o.schedule_steps or run_updates

    def factor(step: int) -> float:  # a plain function: LambdaLR's state_dict then holds no callable state
        return lr_factor(step, o, total)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
