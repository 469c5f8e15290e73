"""TRL's checkpoint arguments -> grpokit's train.out / save_* fields: output_dir, save_strategy, save_steps,
save_total_limit, save_only_model, save_on_each_node, and hub_strategy's check (the pushes themselves are
GRPOTrainer's: by_trainer.py, checkpoint_links.py).

Each argument's mapping rule and its single-value check live here together.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from .batch import epoch_rounds, rounds_per, trl_steps_in
from .predicates import Gate, is_int, is_number
from .rule import Rule, TrlArgs, copied, every_steps, refuse


def _saving(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    if a.save_strategy not in ("steps", "epoch", "no"):
        raise refuse("save_strategy", a.save_strategy, "steps, epoch, no")
    steps_every = (  # transformers: save_steps <= 0 is a period ceil(max_steps * save_steps) <= 0, saving at no step
        rounds_per(every_steps(a.save_steps, trl_steps_in(ctx["steps"], a, ctx)), a, ctx["world_size"])
        if a.save_steps > 0
        else 0
    )
    every = {"steps": steps_every, "epoch": epoch_rounds(a, ctx), "no": 0}[a.save_strategy]  # counts TRL's steps
    if a.enable_jit_checkpoint and every == 0:  # grpokit's SIGTERM checkpoint comes with a run that checkpoints
        raise refuse(
            "enable_jit_checkpoint",
            True,
            f"False with save_strategy={a.save_strategy!r} and save_steps={a.save_steps!r}: transformers writes its "
            "SIGTERM checkpoint even then, grpokit's loop only in a run that writes checkpoints",
        )
    limit = a.save_total_limit if a.save_total_limit and a.save_total_limit > 0 else None  # <= 0: all, as transformers
    keep = limit or max(1, ctx["steps"])  # all: a callback's should_save may checkpoint any round, not only these
    # hub_strategy checkpoint / all_checkpoints: refused with push_to_hub (checks.GATES), inert without, as in TRL
    # TRL reuses output_dir run after run; grpokit's refusal of an occupied folder would break its scripts, and
    # deleting the earlier run would lose it (TRL keeps the checkpoints the new run does not overwrite): it moves
    # whole to output_dir/earlier-runs/<time>/, so the folder's records and checkpoint-N links are one run's
    return {
        "train.save_every": every,
        "train.keep_checkpoints": keep,
        "train.out": a.output_dir or "trainer_output",
        "train.move_earlier_run": True,
        "train.save_last": a.save_strategy != "no" and every != 0,
    }  # transformers: "no" writes no checkpoint


def _save_on_each_node(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    # one node: its main process is global rank 0, where grpokit saves, so True and False write the same files
    if a.save_on_each_node and ctx["world_size"] > int(os.environ.get("LOCAL_WORLD_SIZE", ctx["world_size"])):
        raise refuse(
            "save_on_each_node",
            True,
            "False on several nodes (grpokit saves on global rank 0, for a filesystem every node reads); "
            "on one node either value",
        )
    return {}


SAVE_ONLY_MODEL = Rule(
    ("save_only_model",),
    ("train.save_only_model",),
    "copied: checkpoints without optimizer, schedule and RNG state; a resume from one loads the "
    "weights with a fresh "
    "optimizer and schedule, as transformers",
    copied(**{"train.save_only_model": "save_only_model"}),
)

SAVING = Rule(
    ("output_dir", "save_strategy", "save_steps", "save_total_limit", "hub_strategy"),
    ("train.out", "train.save_every", "train.keep_checkpoints", "train.move_earlier_run", "train.save_last"),
    'None output_dir is "trainer_output"; save_strategy=epoch saves at the end of every epoch (steps '
    "per epoch as TRL's "
    "dataloader counts them, see max_steps) and of training; save_strategy=no writes no checkpoint "
    "(save_last false), as transformers; save_total_limit None (or <= 0, as transformers) keeps all; "
    "output_dir is reused as in TRL, and the folder's earlier run is kept: it moves whole (checkpoints, "
    "checkpoint-N links, records) to output_dir/earlier-runs/<time>/ with a printed line "
    "(train.move_earlier_run=true)",
    _saving,
)

SAVE_ON_EACH_NODE = Rule(
    ("save_on_each_node",),
    (),
    "one node: the same as False (the node's main process is rank 0, where grpokit saves); on several "
    "nodes True is refused",
    _save_on_each_node,
)


_PUSH = Gate(("push_to_hub",), lambda a: a.push_to_hub)

CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {  # single-value checks (checks.py runs them)
    "save_steps": (
        is_number,
        "a finite number (below 1: a fraction of the steps; <= 0: no step checkpoint, as transformers)",
    ),
    "save_total_limit": (
        lambda x: x is None or is_int(x),
        "None or an integer (None or <= 0: keep every checkpoint, as transformers)",
    ),
    "hub_strategy": (
        lambda x: x in ("every_save", "end"),
        "'every_save' or 'end' (a grpokit checkpoint resumes only inside its run folder, so one pushed alone "
        "could not be resumed from as transformers' last-checkpoint is)",
    ),
}

GATES: dict[str, Gate] = {  # fields TRL reads only while another argument is on (checks.py)
    "hub_strategy": _PUSH,
}
