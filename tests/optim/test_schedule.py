"""grpokit's learning-rate schedules (optim/schedule.py): worked by hand, then equal at every update to
transformers' schedule of the same name (``transformers.get_scheduler``, a dev-only oracle)."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.config import OptimConfig
from grpokit.optim.schedule import SCHEDULES, lr_factor, make_scheduler
from helpers.config_errors import optim_error


def rate(schedule: str, step: int, **options) -> float:
    """The multiplier at ``step`` of a 10-update schedule with 2 warm-up updates, lr 1."""
    return lr_factor(step, OptimConfig(lr=1.0, warmup_steps=2, schedule=schedule, **options), 10)


# Worked by hand: lr 1, 10 updates, warmup_steps 2 (updates 0 and 1 run at 0/2 and 1/2, as transformers).
def test_constant_warms_up_from_zero_then_holds():
    assert [rate("constant", s) for s in (0, 1, 2, 9)] == [0.0, 0.5, 1.0, 1.0]


def test_linear_by_hand():
    # update 6: (10 - 6) / (10 - 2) = 0.5; update 10 and after: 0
    assert rate("linear", 6) == 0.5 and rate("linear", 10) == 0.0 and rate("linear", 12) == 0.0


def test_cosine_by_hand():
    # update 6: progress (6 - 2) / 8 = 0.5, 0.5 * (1 + cos(pi * 0.5 * 2 * 0.5)) = 0.5 * (1 + cos(pi / 2)) = 0.5
    assert rate("cosine", 6) == pytest.approx(0.5)
    # num_cycles 1: a whole wave, back to 1 at the end: 0.5 * (1 + cos(2 pi)) = 1
    assert rate("cosine", 10, num_cycles=1.0) == pytest.approx(1.0)


def test_cosine_with_min_lr_by_hand():
    # the cosine's 0.5 at update 6, lifted onto the floor 0.1: 0.5 * (1 - 0.1) + 0.1 = 0.55; at the end 0.1
    assert rate("cosine_with_min_lr", 6, min_lr_rate=0.1) == pytest.approx(0.55)
    assert rate("cosine_with_min_lr", 10, min_lr_rate=0.1) == pytest.approx(0.1)


def test_cosine_warmup_with_min_lr_by_hand():
    # warm-up (step + 1) / 2: 0.5, 1.0; update 5: progress (5 - 2 + 1) / 8 = 0.5 -> 0.5 * 0.9 + 0.1 = 0.55
    assert [rate("cosine_warmup_with_min_lr", s, min_lr_rate=0.1) for s in (0, 1)] == [0.5, 1.0]
    assert rate("cosine_warmup_with_min_lr", 5, min_lr_rate=0.1) == pytest.approx(0.55)
    # warmup_lr_rate 0.2: 0.2 + 0.8 * step / (2 - 1): update 0 at 0.2
    assert rate("cosine_warmup_with_min_lr", 0, min_lr_rate=0.1, warmup_lr_rate=0.2) == pytest.approx(0.2)


def test_cosine_with_restarts_by_hand():
    # two decays over the 8 updates after warm-up: update 4 is halfway down the first (progress 0.25,
    # (2 * 0.25) % 1 = 0.5 -> 0.5 * (1 + cos(pi / 2)) = 0.5); update 6 starts the second at 1
    assert rate("cosine_with_restarts", 4, restart_cycles=2.0) == pytest.approx(0.5)
    assert rate("cosine_with_restarts", 6, restart_cycles=2.0) == pytest.approx(1.0)
    assert rate("cosine_with_restarts", 10, restart_cycles=2.0) == 0.0


def test_polynomial_by_hand():
    # power 2 from 1 to lr_end 0.1: update 6 has 1 - 4 / 8 = 0.5 left: 0.9 * 0.5 ** 2 + 0.1 = 0.325; past the end 0.1
    assert rate("polynomial", 6, power=2.0, lr_end=0.1) == pytest.approx(0.325)
    assert rate("polynomial", 11, power=2.0, lr_end=0.1) == pytest.approx(0.1)


def test_inverse_sqrt_by_hand():
    # timescale 0 -> warmup_steps 2: update 6 runs at 1 / sqrt((6 + 2 - 2) / 2) = 1 / sqrt(3)
    assert rate("inverse_sqrt", 6) == pytest.approx(1 / math.sqrt(3))
    # no warm-up: timescale 10000, update 10000 at 1 / sqrt(2)
    assert lr_factor(10_000, OptimConfig(lr=1.0, schedule="inverse_sqrt"), 10) == pytest.approx(1 / math.sqrt(2))


def test_warmup_stable_decay_by_hand():
    # warm-up from the floor 0.1 (0 * 0.9 + 0.1, 0.5 * 0.9 + 0.1), stable for 10 - 2 - 4 = 4 updates, a linear decay
    # over 4 (update 8: halfway, 0.5 * 0.9 + 0.1 = 0.55), then the floor
    got = [rate("warmup_stable_decay", s, num_decay_steps=4, min_lr_rate=0.1, decay_type="linear") for s in range(11)]
    assert got == pytest.approx([0.1, 0.55, 1, 1, 1, 1, 1.0, 0.775, 0.55, 0.325, 0.1])


def test_the_default_schedule_is_one_at_every_update():
    assert all(lr_factor(s, OptimConfig(), 5) == 1.0 for s in range(7))


# ------------------------------------------------------------------ transformers as the oracle
# (grpokit schedule and options, transformers' name and lr_scheduler_kwargs) with lr 1e-3
CASES = [
    ("constant", {}, "constant_with_warmup", {}),
    ("linear", {}, "linear", {}),
    ("cosine", {}, "cosine", {}),
    ("cosine", {"num_cycles": 1.5}, "cosine", {"num_cycles": 1.5}),
    ("cosine_with_min_lr", {"min_lr_rate": 0.1}, "cosine_with_min_lr", {"min_lr_rate": 0.1}),
    ("cosine_with_min_lr", {"min_lr_rate": 1e-4 / 1e-3}, "cosine_with_min_lr", {"min_lr": 1e-4}),
    (
        "cosine_with_min_lr",
        {"min_lr_rate": 0.2, "num_cycles": 1.0},
        "cosine_with_min_lr",
        {"min_lr_rate": 0.2, "num_cycles": 1.0},
    ),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}, "cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
    (
        "cosine_warmup_with_min_lr",
        {"min_lr_rate": 0.1, "warmup_lr_rate": 0.3},
        "cosine_warmup_with_min_lr",
        {"min_lr_rate": 0.1, "warmup_lr_rate": 0.3},
    ),
    ("cosine_with_restarts", {}, "cosine_with_restarts", {}),
    ("cosine_with_restarts", {"restart_cycles": 3.0}, "cosine_with_restarts", {"num_cycles": 3}),
    ("polynomial", {}, "polynomial", {}),
    ("polynomial", {"power": 2.0, "lr_end": 1e-4}, "polynomial", {"power": 2.0, "lr_end": 1e-4}),
    ("inverse_sqrt", {}, "inverse_sqrt", {}),
    ("inverse_sqrt", {"timescale": 5}, "inverse_sqrt", {"timescale": 5}),
    ("warmup_stable_decay", {"num_decay_steps": 4}, "warmup_stable_decay", {"num_decay_steps": 4}),
    (
        "warmup_stable_decay",
        {
            "num_decay_steps": 3,
            "num_stable_steps": 2,
            "min_lr_rate": 0.1,
            "decay_type": "1-sqrt",
            "warmup_type": "cosine",
        },
        "warmup_stable_decay",
        {
            "num_decay_steps": 3,
            "num_stable_steps": 2,
            "min_lr_ratio": 0.1,
            "decay_type": "1-sqrt",
            "warmup_type": "cosine",
        },
    ),
    (
        "warmup_stable_decay",
        {"num_decay_steps": 5, "decay_type": "linear", "warmup_type": "1-sqrt", "num_cycles": 1.0},
        "warmup_stable_decay",
        {"num_decay_steps": 5, "decay_type": "linear", "warmup_type": "1-sqrt", "num_cycles": 1.0},
    ),
]


def rates(scheduler, n: int) -> list[float]:
    out = []
    for _ in range(n):
        out.append(scheduler.get_last_lr()[0])  # the rate of the next update
        scheduler.optimizer.step()
        scheduler.step()
    return out


@pytest.mark.filterwarnings("ignore:Both num_training_steps and num_stable_steps")  # transformers' note on the wsd case
@pytest.mark.parametrize("warmup", [0, 3])
@pytest.mark.parametrize("ours, options, name, kwargs", CASES, ids=[f"{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_every_update_has_transformers_rate(ours, options, name, kwargs, warmup):
    from transformers import get_scheduler

    total = 12
    p = torch.nn.Parameter(torch.zeros(1))
    theirs = get_scheduler(
        name,
        torch.optim.SGD([p], lr=1e-3),
        num_warmup_steps=warmup,
        num_training_steps=total,
        scheduler_specific_kwargs=dict(kwargs),
    )
    cfg = OptimConfig(lr=1e-3, warmup_steps=warmup, schedule=ours, **options)
    mine = make_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3), cfg, total)
    assert rates(mine, total + 3) == pytest.approx(rates(theirs, total + 3), rel=1e-12, abs=0)


def test_schedule_steps_sets_the_length():
    cfg = OptimConfig(lr=1.0, schedule="linear", schedule_steps=4)
    sched = make_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), cfg, run_updates=100)
    assert rates(sched, 5) == [1.0, 0.75, 0.5, 0.25, 0.0]  # (4 - s) / 4, not (100 - s) / 100


def test_every_schedule_is_covered_by_the_oracle():
    assert {c[0] for c in CASES} == set(SCHEDULES)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"schedule": "reduce_lr_on_plateau"},
            "optim.schedule='reduce_lr_on_plateau' is not valid; choose one of: constant, linear",
        ),
        (
            {"schedule": "cosine", "min_lr_rate": 0.1},
            "optim.min_lr_rate=0.1 has no effect with optim.schedule=cosine; it is read by "
            "optim.schedule cosine_with_min_lr, cosine_warmup_with_min_lr, warmup_stable_decay",
        ),
        (
            {"schedule": "polynomial", "lr_end": 1e-5},
            "optim.lr_end=1e-05 must be below optim.lr=1e-06 with optim.schedule=polynomial",
        ),
        (
            {"schedule": "cosine_with_min_lr", "min_lr_rate": 1.5},
            "optim.min_lr_rate=1.5 must be in [0, 1] (a fraction of optim.lr)",
        ),
        (
            {"schedule": "warmup_stable_decay", "decay_type": "exp"},
            "optim.decay_type='exp' is not valid; choose one of: linear, cosine, 1-sqrt",
        ),
    ],
)
def test_schedule_mistakes_are_one_sentence(overrides, message):
    assert optim_error(overrides).startswith(message)
