"""TRL 1.16 GRPOConfig -> grpokit Config: the mapping, in one table that the code runs and the docs show.

``MAPPING`` is the one place that says which grpokit field each TRL argument sets; ``to_config``
runs it and ``mapping_table`` renders it for docs/TRL.md (tests/trl/test_trl_mapping.py checks the
committed table equals the generated one, so the documentation cannot drift from the code).

Step semantics. A TRL step is one optimizer update over ``per_device_train_batch_size *
gradient_accumulation_steps * processes`` completions; one generation batch of
``per_device_train_batch_size * steps_per_generation * processes`` completions feeds
``steps_per_generation / gradient_accumulation_steps`` of them, ``num_iterations`` times. A grpokit
step samples ``prompts_per_step * group_size`` completions and makes ``num_iterations *
updates_per_batch`` updates on them. So ``prompts_per_step = generation batch / num_generations``,
``micro_batch_size = per_device_train_batch_size``, ``updates_per_batch = steps_per_generation /
gradient_accumulation_steps`` and ``train.steps = max_steps / (num_iterations * updates_per_batch)``.
When steps_per_generation is not a multiple of gradient_accumulation_steps, an optimizer step spans
generation batches (TRL's rolling window): ``updates_per_batch = steps_per_generation`` slices, of which
``accumulation_slices = gradient_accumulation_steps`` make one update, and ``max_updates = max_steps``.
"""

from __future__ import annotations

import dataclasses

from grpokit.config.io import set_field
from grpokit.config.sections import Config
from grpokit.train.distributed import joined, position

from .args import batch, checkpoints, loss, model, optimizer, reporting, run, sampling
from .args.batch import steps_fields
from .args.by_trainer import HANDLED_ELSEWHERE
from .args.checks import check_gated
from .args.rule import Rule
from .config import SUPPORTED, UNSUPPORTED, GRPOConfig

# The table's rows, in docs/TRL.md's order; a later row's field wins over an earlier one's
# (model.trust_remote_code, algo.scale, algo.ratio_level), so the order is part of the mapping.
MAPPING: list[Rule] = [
    checkpoints.SAVE_ONLY_MODEL,
    checkpoints.SAVING,
    batch.BATCH,
    batch.STEPS,
    optimizer.LEARNING_RATE,
    optimizer.SCHEDULE,
    optimizer.OPTIMIZER,
    model.PRECISION,
    model.ACTIVATION_CHECKPOINTING,
    model.MODEL_INIT,
    model.DEVICE,
    run.SEEDS,
    sampling.GENERATION,
    sampling.CHAT_TEMPLATE,
    sampling.VLLM,
    loss.KL,
    loss.ITERATIONS,
    loss.CLIPPING,
    loss.RATIO_LEVEL,
    loss.REWARD_SCALING,
    loss.LOSS_TYPE,
    loss.OBJECTIVES,
    loss.REWARD_WEIGHTS,
    loss.MASK_TRUNCATED,
    loss.REF_SYNC,
    loss.ENTROPY_MASK,
    loss.ENTROPY_BONUS,
    checkpoints.SAVE_ON_EACH_NODE,
    model.MODEL_TERMS,
    model.COMPILE,
    model.DROPOUT,
    model.KERNELS,
    loss.OFF_POLICY_MASK,
    sampling.TOOL_TURNS,
    reporting.LOGGING,
    reporting.SAMPLES,
    run.DDP_TIMEOUT,
    run.FSDP,
    run.EVALUATION,
]
FIXED = {
    "data.task": "",
    "data.dataset": "",
    "data.eval_dataset": "",
    "reward.functions": [],
    "reward.convention": "trl",
    "reward.num_workers": 0,
    "model.freeze_vision": False,
    "data.drop_last": True,
}  # grpokit fields the TRL layer always sets (FIXED_DOC says why)


TRL_NAMES = {
    "rollout.vllm_url": "vllm_server_base_url",
    "rollout.vllm_startup_timeout": "vllm_server_timeout",
    "rollout.max_new_tokens": "max_completion_length",
    "env.max_episode_tokens": "max_completion_length",
}
"""grpokit fields that a sentence from inside the run (not from the mapping's own checks) may name, and the
TRL argument a script sets each with (its rule in MAPPING): under grpokit.trl the sentence names the argument
(trainer.py builds the run inside ``config.base.named_as`` of these names)."""


def to_config(
    args: GRPOConfig,
    *,
    num_rows: int,
    world_size: int | None = None,
    streamed: bool = False,
    episodes: bool = True,
) -> Config:
    """The grpokit ``Config`` of a TRL ``GRPOConfig`` (``num_rows``: training prompts, for epochs;
    ``streamed``: an IterableDataset, which has no epochs; ``episodes``: the trainer has tools or an
    environment_factory, the only runs whose episode settings TRL reads)."""
    ctx = {
        "num_rows": num_rows,
        "world_size": world_size or position()[1],  # the joined process group, else torchrun's WORLD_SIZE
        "joined": joined(),  # a process group joined already (by the GRPOConfig under torchrun): its timeout is set
        "streamed": streamed,
        "episodes": episodes,
    }
    check_gated(args)  # arguments set after construction may have turned a gate on
    cfg = Config()
    for name, value in FIXED.items():
        set_field(cfg, name, value)
    ctx["steps"] = steps_fields(args, ctx)["train.steps"]
    for rule in MAPPING:
        for name, value in rule.apply(args, ctx).items():
            set_field(cfg, name, value)
    return cfg


def mapping_table() -> str:
    """docs/TRL.md's tables, rendered from MAPPING, HANDLED_ELSEWHERE, FIXED and UNSUPPORTED."""
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(GRPOConfig)
        if f.name in SUPPORTED
    }
    lines = ["| TRL argument (default) | grpokit field | how |", "| --- | --- | --- |"]
    for rule in MAPPING:
        # `if n in defaults`: an older transformers lacks some of a rule's arguments
        args = "<br>".join(f"`{n}` ({defaults[n]!r})" for n in rule.args if n in defaults)
        lines.append(f"| {args} | {'<br>'.join(f'`{f}`' for f in rule.fields)} | {rule.how} |")
    for name, how in HANDLED_ELSEWHERE.items():
        lines.append(f"| `{name}` ({defaults[name]!r}) | (GRPOTrainer) | {how} |")
    covered = {n for r in MAPPING for n in r.args} | set(HANDLED_ELSEWHERE)
    missing = [n for n in defaults if n not in covered]
    if missing:  # every declared argument must be mapped somewhere
        raise AssertionError(f"GRPOConfig arguments without a mapping rule: {missing}")
    fixed = ", ".join(f"`{k}={v!r}`" for k, v in FIXED.items())
    lines += [
        "",
        f"Always set by the TRL layer: {fixed}. {' '.join(FIXED_DOC.split())}",
        "",
        "Accepted only at TRL's default (any other value is refused with one sentence naming the argument):",
        "",
        ", ".join(f"`{k}`" for k in UNSUPPORTED) + ".",
        "",
    ]
    return "\n".join(lines)


FIXED_DOC = """The data and reward functions come from GRPOTrainer's arguments; reward functions receive TRL's
convention and run in the trainer's process. A vision-language model's vision tower trains as TRL trains it (TRL
freezes nothing; a tower the script froze itself stays frozen), and LoRA's all-linear is PEFT's, the tower's linear
layers included. An epoch is whole generation batches, as TRL's RepeatSampler yields them: the rows after an epoch's
last whole batch wait for a later epoch's order, so the logged epoch is the data seen."""
