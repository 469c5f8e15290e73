"""What a checkpoint carries besides weights, optimizer, schedule and random states: the state the
variants keep between steps (lambda-GRPO's lambda and its Adam moments, the adaptive entropy
coefficient: ``StageState``, algo/stage_state.py), an update still accumulating
(train.accumulation_slices: a window that spans the checkpoint's step), its gradient and metric
sums, so that the resumed run applies exactly the update the uninterrupted one would, and the
reference model once algo.ref_refresh_every has refreshed it (``reference_state``): a resumed run
measures its KL against the copy the uninterrupted run would, not against the starting model.

``Trainer.save`` and ``Trainer._resume`` (train/loop.py) call these with the few objects they need.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from grpokit.algo.stage_state import StageState
from grpokit.config.sections import ConfigError

from . import checkpoint
from .models import refresh_reference
from .update import Accumulator


def saved_extra(
    stage_states: list[StageState],
    pending: Accumulator,
    optimizer,
    sampler=None,
    engine_state: dict | None = None,
    reference: dict | None = None,
) -> dict[str, Any] | None:
    """Every stage state under its key, ``pending_update`` while an update holds slices, ``sampler``
    when the prompt sampler keeps more than its position (domains, a curriculum), ``async_rollout``
    for the async sampler's in-flight batches (rollout/async_plan.py) and ``reference``
    (``reference_state``'s) (None: nothing)."""
    extra = {state.key: state.state_dict() for state in stage_states}
    extra |= {"reference": reference} if reference is not None else {}
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


def reference_state(ref_model, step: int, refreshed_at: int, copied: bool, every: int) -> dict | None:
    """What rebuilds the reference of a checkpoint at ``step`` exactly: the step whose end last refreshed it
    (``refreshed_at``, 0: never, it is the starting model, which a resume copies again) and its weights, left out
    when that refresh was a plain copy (``copied``: ref_mixup_alpha 1) made at ``step`` itself: the checkpoint's
    policy weights are then the reference's. None without a reference, or with neither refreshes configured
    (``every``: algo.ref_refresh_every) nor made."""
    if ref_model is None or not (every or refreshed_at):
        return None
    kept = refreshed_at and not (copied and refreshed_at == step)
    weights = {k: v.detach().cpu().clone() for k, v in ref_model.state_dict().items()} if kept else None
    return {"refreshed_at": refreshed_at, "weights": weights}


def restore_reference(ckpt: Path, ref_model, model, step: int, every: int, alpha: float) -> tuple[int, bool]:
    """Put back the reference ``reference_state`` kept (after the checkpoint's policy weights are loaded into
    ``model``); returns the step of its last refresh and whether that was a plain copy at ``step``. A checkpoint
    without that record (written before grpokit kept it, or by a run without refreshes) is trusted where the
    reference follows from the config: no refresh due yet (``every``: algo.ref_refresh_every), or a plain copy
    (``alpha`` 1) due at ``step`` itself; anything else is refused in one sentence, since the run would measure
    its KL against the wrong model."""
    if ref_model is None:
        return 0, True
    saved = checkpoint.load_extra(ckpt).get("reference")
    if saved is None:
        last = step // every * every if every else 0
        if last and not (last == step and alpha == 1.0):
            where = (
                f"a checkpoint at a multiple of {every} steps"
                if alpha == 1.0
                else "a checkpoint of this grpokit version"
            )
            raise ConfigError(
                f"checkpoint {str(ckpt)!r} holds no reference model, yet algo.ref_refresh_every={every} refreshed it "
                f"at step {last}, so it is not the starting model; resume from {where}, or with the run's own algo "
                "section"
            )
        saved = {"refreshed_at": last, "weights": None}
    if saved["weights"] is not None:
        ref_model.load_state_dict(saved["weights"])
    elif saved["refreshed_at"]:  # refreshed with a plain copy at the checkpoint's own step
        refresh_reference(ref_model, model)
    return int(saved["refreshed_at"]), saved["weights"] is None


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
