"""TRL's batch and step arguments -> grpokit's batch, step count and epochs: per_device_train_batch_size,
gradient_accumulation_steps, num_generations, steps_per_generation, generation_batch_size, max_steps,
num_train_epochs (and pad_to_multiple_of's check).

A TRL step is one optimizer update; a grpokit step (a round) samples one generation batch and
makes num_iterations * updates_per_batch updates on it (mapping.py's docstring); when steps_per_generation
is not a multiple of gradient_accumulation_steps, TRL's rolling window (train.accumulation_slices). An epoch is
TRL's: its RepeatSampler keeps whole generation batches of train_dataset only, and transformers counts the
optimizer updates they feed (checked against TRL itself in tests/trl/test_trl_scripts.py). The other groups
count their step settings in TRL's steps through ``rounds_per`` and ``epoch_rounds``.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable

from grpokit.config.base import ConfigError
from grpokit.train.update_windows import total_updates

from .predicates import at_least, is_int, is_number
from .rule import Rule, TrlArgs


def generation_steps(a: TrlArgs, world_size: int) -> int:
    """TRL's steps_per_generation: given, or from generation_batch_size, or gradient_accumulation_steps."""
    per_pass = a.per_device_train_batch_size * world_size
    derived = a.__dict__.get("_derived", (None, None))  # the one GRPOConfig.__post_init__ filled in, as TRL's
    spg = None if derived == ("steps_per_generation", a.steps_per_generation) else a.steps_per_generation
    gbs = None if derived == ("generation_batch_size", a.generation_batch_size) else a.generation_batch_size
    if spg is not None and gbs is not None:
        if gbs == per_pass * spg:
            return spg
        raise ConfigError(
            "GRPOConfig arguments steps_per_generation and generation_batch_size are both set; set one of them"
        )
    if gbs is None:
        return spg or a.gradient_accumulation_steps
    if gbs % per_pass:
        raise ConfigError(
            f"GRPOConfig argument generation_batch_size={gbs} is not a multiple of "
            f"per_device_train_batch_size * processes = {per_pass}; make it one"
        )
    return gbs // per_pass


def slicing(a: TrlArgs, world_size: int) -> tuple[int, int]:
    """``(train.updates_per_batch, train.accumulation_slices)``: steps_per_generation / gradient_accumulation_steps
    slices of one update each when it is a multiple of it; else steps_per_generation slices, of which every
    gradient_accumulation_steps consecutive ones (across generation batches) make one update, as TRL's loop."""
    spg, ga = generation_steps(a, world_size), a.gradient_accumulation_steps
    return (spg // ga, 1) if spg % ga == 0 else (spg, ga)


def rounds_for(trl_steps: int, a: TrlArgs, ctx: dict) -> int:
    """grpokit steps (generation batches) whose updates reach ``trl_steps`` TRL steps."""
    parts, window = slicing(a, ctx["world_size"])
    rounds = math.ceil(trl_steps * window / (a.num_iterations * parts))  # whole windows only: an upper bound
    while rounds > 1 and trl_steps_in(rounds - 1, a, ctx) >= trl_steps:  # epochs' short windows
        rounds -= 1
    return rounds


def rounds_per(trl_steps: int, a: TrlArgs, world_size: int) -> int:
    """A period of ``trl_steps`` TRL steps in whole grpokit steps (rounded down, at least 1): the
    grpokit period of TRL's save_steps and ref_model_sync_steps, since grpokit saves and syncs per round."""
    parts, window = slicing(a, world_size)
    return max(1, trl_steps * window // (a.num_iterations * parts))


def trl_steps_in(rounds: int, a: TrlArgs, ctx: dict) -> int:
    """TRL steps (optimizer updates) in ``rounds`` grpokit steps: whole windows of the slices (an epoch's
    last one shorter), capped at max_steps."""
    parts, window = slicing(a, ctx["world_size"])
    return total_updates(rounds, a.num_iterations * parts, window, max(a.max_steps, 0), window_epoch(a, ctx))


def window_epoch(a: TrlArgs, ctx: dict) -> int:
    """train.accumulation_epoch_steps: in the rolling window over a dataset with a length, the rounds of an
    epoch, whose last accumulation transformers closes early; else 0."""
    return epoch_rounds(a, ctx) if slicing(a, ctx["world_size"])[1] > 1 and not ctx.get("streamed") else 0


def batch_fields(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    per_step = a.per_device_train_batch_size * generation_steps(a, ctx["world_size"]) * ctx["world_size"]
    if per_step % a.num_generations:
        raise ConfigError(
            f"the generation batch of per_device_train_batch_size * steps_per_generation * processes = {per_step} "
            f"completions is not a multiple of num_generations={a.num_generations}; make it one"
        )
    _whole_groups_per_process(a, ctx["world_size"])
    parts, window = slicing(a, ctx["world_size"])
    return {
        "train.prompts_per_step": per_step // a.num_generations,
        "train.micro_batch_size": a.per_device_train_batch_size,
        "train.updates_per_batch": parts,
        "train.accumulation_slices": window,
        "train.accumulation_epoch_steps": window_epoch(a, ctx),
    }


def _whole_groups_per_process(a: TrlArgs, world_size: int) -> None:
    """Several processes: grpokit samples and scores each group on one process, so every process's share of a
    generation batch (per_device_train_batch_size * steps_per_generation completions) must hold whole groups of
    num_generations. TRL also splits a group across processes (it gathers the rewards for the advantages);
    that is refused here in TRL's own terms, with the nearest valid batch size."""
    spg = generation_steps(a, world_size)
    share, G = a.per_device_train_batch_size * spg, a.num_generations
    if world_size == 1 or share % G == 0:
        return
    unit = G // math.gcd(spg, G)  # the batch sizes that work are the multiples of this
    valid = -(-a.per_device_train_batch_size // unit) * unit
    other = f", or a num_generations >= 2 that divides {share}" if share >= 2 else ""
    raise ConfigError(
        f"per_device_train_batch_size * steps_per_generation = {a.per_device_train_batch_size} * {spg} = {share} "
        f"completions per process is not a multiple of num_generations={G}: TRL would split a group across the "
        f"{world_size} processes, grpokit.trl keeps each group on one process; use per_device_train_batch_size="
        f"{valid} (a multiple of {unit}){other}"
    )


def prompts_per_round(a: TrlArgs, world_size: int) -> int:
    """Prompts of one generation batch over every process (at least 1)."""
    return max(1, a.per_device_train_batch_size * generation_steps(a, world_size) * world_size // a.num_generations)


def check_whole_batch(a: TrlArgs, num_rows: int, world_size: int) -> None:
    """TRL's RepeatSampler yields whole generation batches of train_dataset only: with fewer rows than one batch's
    prompts TRL trains no step (max_steps) or fails (num_train_epochs: "args.max_steps must be set to a positive
    value"); refused in one sentence when train() starts (construction and evaluate() need no training batch)."""
    spg, per = generation_steps(a, world_size), prompts_per_round(a, world_size)
    if num_rows >= per:
        return
    raise ConfigError(
        f"train_dataset has {num_rows} rows, fewer than the {per} prompts of one generation batch "
        f"(per_device_train_batch_size * steps_per_generation * processes / num_generations = "
        f"{a.per_device_train_batch_size} * {spg} * {world_size} / {a.num_generations}), and TRL's RepeatSampler "
        f"yields whole generation batches only, so no step would train; give at least {per} rows, or lower "
        "per_device_train_batch_size or steps_per_generation"
    )


def steps_per_epoch(a: TrlArgs, num_rows: int, world_size: int, streamed: bool = False) -> int:
    """TRL steps in one pass over ``num_rows`` prompts, as transformers counts them on TRL's dataloader: the
    epoch's micro-batches (``micro_steps_per_epoch``: a stream's, max_steps of them) in updates of
    gradient_accumulation_steps (``epoch_updates``)."""
    return epoch_updates(micro_steps_per_epoch(a, num_rows, world_size, streamed), a.gradient_accumulation_steps)


def epoch_updates(micro_steps: int, accumulation: int) -> int:
    """Optimizer updates of an epoch of ``micro_steps`` micro-batches, ``accumulation`` an update: a shorter last
    accumulation counts, as transformers (at least 1). Example: 10 micro-batches, 4 an update: 3."""
    return max(1, -(-micro_steps // accumulation))


def micro_steps_per_epoch(a: TrlArgs, num_rows: int, world_size: int, streamed: bool = False) -> int:
    """Micro-batches in one of TRL's epochs, transformers' ``steps_in_epoch`` (the dataloader's length per
    process): whole generation batches times num_iterations * steps_per_generation; a stream's is
    max_steps * gradient_accumulation_steps (transformers' length of a dataloader without one)."""
    if streamed:
        return max(1, a.max_steps) * a.gradient_accumulation_steps
    rounds = num_rows // prompts_per_round(a, world_size)
    return max(1, rounds * a.num_iterations * generation_steps(a, world_size))


def trl_epoch(step: int, per_epoch: int, micro_steps: int, accumulation: int) -> float:
    """transformers' ``state.epoch`` after optimizer step ``step`` (1-based): the epochs done plus the running
    epoch's micro-batches over its ``micro_steps`` (``epoch + (step + 1) / steps_in_epoch``, step counting
    micro-batches), so an epoch whose last update takes fewer than ``accumulation`` micro-batches ends at a
    whole number and its earlier updates stand at multiples of accumulation / micro_steps."""
    done = (step - 1) // per_epoch
    return done + min((step - done * per_epoch) * accumulation, micro_steps) / micro_steps


def state_epochs(a: TrlArgs, max_steps: int, per_epoch: int, streamed: bool) -> int:
    """transformers' ``state.num_train_epochs``: the epochs its loop would run, ceil(max_steps / steps per epoch)
    with max_steps, ceil(num_train_epochs) without, and sys.maxsize for a stream (it loops until max_steps)."""
    if streamed:
        return sys.maxsize
    if a.max_steps > 0:
        return -(-max_steps // per_epoch)
    return math.ceil(a.num_train_epochs)


def trl_max_steps(a: TrlArgs, ctx: dict) -> int:
    """TRL's run length in its steps: max_steps, or ceil(num_train_epochs * steps per epoch) (transformers)."""
    if a.max_steps > 0:
        return a.max_steps  # num_train_epochs is not read then, whatever its value (transformers)
    if a.num_train_epochs <= 0:
        raise ConfigError(
            f"GRPOConfig argument num_train_epochs={a.num_train_epochs} with max_steps={a.max_steps} trains no step "
            "(TRL would train none either); set num_train_epochs > 0 or max_steps > 0"
        )
    return math.ceil(a.num_train_epochs * steps_per_epoch(a, ctx["num_rows"], ctx["world_size"]))


def steps_fields(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    """train.steps: the rounds that reach TRL's run length, and max_updates = that length, so the run ends
    right after TRL's last step even inside a generation batch (max_steps 3 with num_iterations 2: the
    second batch's first update; the rolling window: wherever the window falls)."""
    trl_steps = trl_max_steps(a, ctx)
    return {"train.steps": rounds_for(trl_steps, a, ctx), "train.max_updates": trl_steps}


def epoch_rounds(a: TrlArgs, ctx: dict) -> int:
    """grpokit steps (sampling rounds) in one of TRL's epochs: its whole generation batches."""
    return max(1, ctx["num_rows"] // prompts_per_round(a, ctx["world_size"]))


BATCH = Rule(
    (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "num_generations",
        "steps_per_generation",
        "generation_batch_size",
    ),
    (
        "train.prompts_per_step",
        "train.micro_batch_size",
        "rollout.group_size",
        "train.updates_per_batch",
        "train.accumulation_slices",
        "train.accumulation_epoch_steps",
    ),
    "prompts_per_step = per_device_train_batch_size * steps_per_generation (None: gradient_accumulation_steps) * "
    "processes / num_generations; updates_per_batch = steps_per_generation / gradient_accumulation_steps "
    "(generation_batch_size: steps_per_generation = it / (per_device_train_batch_size * processes)); "
    "not a multiple: "
    "updates_per_batch = steps_per_generation and accumulation_slices = gradient_accumulation_steps, TRL's rolling "
    "window (an optimizer step may span two generation batches; one process only), whose last window of an epoch "
    "is shorter, as transformers' (accumulation_epoch_steps = the generation batches of an epoch; "
    "none when streamed). Several processes: each keeps whole groups, so per_device_train_batch_size * "
    "steps_per_generation must be a multiple of num_generations (TRL also splits a group across processes)",
    lambda a, ctx: {**batch_fields(a, ctx), "rollout.group_size": a.num_generations},
)

STEPS = Rule(
    ("max_steps", "num_train_epochs"),
    ("train.steps", "train.max_updates"),
    "steps = max_steps / (num_iterations * updates_per_batch); max_steps -1: ceil(num_train_epochs * "
    "steps per epoch), an "
    "epoch being TRL's: the whole generation batches in train_dataset (its last rows short of one are dropped, as "
    "RepeatSampler does), each num_iterations * steps_per_generation / gradient_accumulation_steps steps; rolling "
    "window: steps = TRL's steps * accumulation_slices / (num_iterations * updates_per_batch) rounded up; "
    "max_updates = TRL's steps, so the run ends right after TRL's last step, even inside a generation batch",
    steps_fields,
)


CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {  # single-value checks (checks.py runs them)
    "per_device_train_batch_size": (at_least(1, integer=True), "an integer >= 1"),
    "gradient_accumulation_steps": (at_least(1, integer=True), "an integer >= 1"),
    "num_generations": (at_least(2, integer=True), "an integer >= 2 (a group needs two completions to compare)"),
    "steps_per_generation": (at_least(1, integer=True, none=True), "None or an integer >= 1"),
    "generation_batch_size": (at_least(1, integer=True, none=True), "None or an integer >= 1"),
    "max_steps": (is_int, "an integer (<= 0: use num_train_epochs, as transformers)"),
    "num_train_epochs": (is_number, "a finite number (read when max_steps <= 0, where it must be > 0)"),
    "pad_to_multiple_of": (
        lambda x: x in (None, "auto") or (is_int(x) and x != 0),
        "None, 'auto' or a non-zero integer (0 divides by zero in TRL)",
    ),
}
