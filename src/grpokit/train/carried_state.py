"""What a checkpoint carries besides weights, optimizer, schedule and random states: the state the
variants keep between steps (lambda-GRPO's lambda and its Adam moments, the adaptive entropy
coefficient: ``StageState``, algo/stage_state.py) and an update still accumulating
(train.accumulation_slices: a window that spans the checkpoint's step), its gradient and metric
sums, so that the resumed run applies exactly the update the uninterrupted one would.

``Trainer.save`` and ``Trainer._resume`` (train/loop.py) call these with the few objects they need.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from grpokit.algo.stage_state import StageState
from grpokit.config.sections import ConfigError

from . import checkpoint
from .update import Accumulator


def saved_extra(
    stage_states: list[StageState], pending: Accumulator, optimizer, sampler=None, engine_state: dict | None = None
) -> dict[str, Any] | None:
    """Every stage state under its key, ``pending_update`` while an update holds slices, ``sampler``
    when the prompt sampler keeps more than its position (domains, a curriculum) and ``async_rollout``
    for the async sampler's in-flight batches (rollout/async_plan.py) (None: nothing)."""
    extra = {state.key: state.state_dict() for state in stage_states}
    extra |= {"pending_update": pending_state(pending, optimizer)} if pending.slices else {}
    sampled = sampler.state_dict() if sampler is not None else {}
    extra |= {"sampler": sampled} if set(sampled) - {"position"} else {}
    extra |= {"async_rollout": engine_state} if engine_state is not None else {}
    return extra or None


def restore_sampler(ckpt: Path, sampler) -> None:
    """The sampler's state as ``saved_extra`` wrote it (nothing to do for a plain sampler: the checkpoint's
    data position is all of it)."""
    if set(sampler.state_dict()) - {"position"}:
        state = checkpoint.load_extra(ckpt).get("sampler")
        if state is None:
            raise ConfigError(
                f"checkpoint {str(ckpt)!r} holds no prompt sampler state (it was written without data.domains "
                "or data.curriculum); resume with the run's own config"
            )
        sampler.load_state_dict(state)


def restore_extra(
    ckpt: Path, stage_states: list[StageState], optimizer, accumulation_slices: int
) -> Accumulator | None:
    """Load what ``saved_extra`` wrote into ``stage_states``; return the pending update (None: none
    was pending). A stage the config has but the checkpoint lacks is refused in one sentence."""
    needed = bool(stage_states) or accumulation_slices > 1
    extra = checkpoint.load_extra(ckpt) if needed else {}
    pending = None
    if "pending_update" in extra:
        pending = Accumulator(**load_pending(extra["pending_update"], optimizer))
    for state in stage_states:
        if state.key in extra:
            state.load_state_dict(extra[state.key])
        elif state.required:
            raise ConfigError(
                f"checkpoint {str(ckpt)!r} holds no {state.key} state (it was written with another "
                "algo section); resume with the run's own config"
            )
    return pending


def pending_state(acc, optimizer) -> dict:
    """An update still accumulating (train/update.py's ``Accumulator``): its metric sums and the
    gradient it has put into every parameter of ``optimizer`` so far (None where a parameter has none)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return {
        "accumulator": dataclasses.asdict(acc) | {"bonus": acc.bonus},
        "grads": [p.grad.detach().cpu().clone() if p.grad is not None else None for p in params],
    }


def load_pending(state: dict, optimizer) -> dict:
    """Put ``pending_state``'s gradient back into the parameters; returns the ``Accumulator``'s fields."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for p, g in zip(params, state["grads"], strict=True):
        p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
    return state["accumulator"]
