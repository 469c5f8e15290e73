"""The mapping's rules for TRL's training schedule: checkpoints, the batch (generations, micro-batches,
the rolling window), steps and epochs, the optimizer and its learning-rate schedule.

Rows of ``MAPPING`` (grpokit/trl/mapping.py), in the order docs/TRL.md shows them; their arithmetic
lives in step_args.py and optim_args.py.
"""

from __future__ import annotations

from typing import Any

from .config import GRPOConfig
from .optim_args import optimizer_fields, schedule_fields
from .rule import Rule, copied, every_steps, refuse
from .step_args import batch_fields, epoch_rounds, rounds_per, steps_fields, trl_max_steps, trl_steps_in


def _saving(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
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
    keep = limit or (ctx["steps"] // every + 1 if every else 1)
    # hub_strategy checkpoint / all_checkpoints: refused with push_to_hub (checks.GATES), inert without, as in TRL
    # TRL reuses output_dir run after run; grpokit's refusal of an occupied folder would break its scripts
    return {
        "train.save_every": every,
        "train.keep_checkpoints": keep,
        "train.out": a.output_dir or "trainer_output",
        "train.overwrite": True,
        "train.save_last": a.save_strategy != "no" and every != 0,
    }  # transformers: "no" writes no checkpoint


TRAINING_RULES: list[Rule] = [
    Rule(
        ("save_only_model",),
        ("train.save_only_model",),
        "copied: checkpoints without optimizer, schedule and RNG state; a resume from one loads the "
        "weights with a fresh "
        "optimizer and schedule, as transformers",
        copied(**{"train.save_only_model": "save_only_model"}),
    ),
    Rule(
        ("output_dir", "save_strategy", "save_steps", "save_total_limit", "hub_strategy"),
        ("train.out", "train.save_every", "train.keep_checkpoints", "train.overwrite", "train.save_last"),
        'None output_dir is "trainer_output"; save_strategy=epoch saves at the end of every epoch (steps '
        "per epoch as TRL's "
        "dataloader counts them, see max_steps) and of training; save_strategy=no writes no checkpoint "
        "(save_last false), as transformers; save_total_limit None (or <= 0, as transformers) keeps all; "
        "output_dir is reused as in TRL (train.overwrite=true: a new run replaces the folder's run)",
        _saving,
    ),
    Rule(
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
        "none when streamed)",
        lambda a, ctx: {**batch_fields(a, ctx), "rollout.group_size": a.num_generations},
    ),
    Rule(
        ("max_steps", "num_train_epochs"),
        ("train.steps", "train.max_updates"),
        "steps = max_steps / (num_iterations * updates_per_batch); max_steps -1: ceil(num_train_epochs * "
        "steps per epoch), an "
        "epoch being TRL's: the whole generation batches in train_dataset (its last rows short of one are dropped, as "
        "RepeatSampler does), each num_iterations * steps_per_generation / gradient_accumulation_steps steps; rolling "
        "window: steps = TRL's steps * accumulation_slices / (num_iterations * updates_per_batch) rounded up; "
        "max_updates = TRL's steps, so the run ends right after TRL's last step, even inside a generation batch",
        steps_fields,
    ),
    Rule(
        ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm"),
        (
            "optim.lr",
            "optim.weight_decay",
            "optim.adam_beta1",
            "optim.adam_beta2",
            "optim.adam_eps",
            "optim.max_grad_norm",
        ),
        "copied; max_grad_norm <= 0: no clipping (0), as transformers",
        lambda a, ctx: {
            "optim.lr": a.learning_rate,
            "optim.weight_decay": a.weight_decay,
            "optim.adam_beta1": a.adam_beta1,
            "optim.adam_beta2": a.adam_beta2,
            "optim.adam_eps": a.adam_epsilon,
            "optim.max_grad_norm": max(a.max_grad_norm, 0.0),
        },
    ),
    Rule(
        ("lr_scheduler_type", "warmup_steps", "lr_scheduler_kwargs"),
        (
            "optim.schedule",
            "optim.warmup_steps",
            "optim.schedule_steps",
            "optim.num_cycles",
            "optim.restart_cycles",
            "optim.min_lr_rate",
            "optim.warmup_lr_rate",
            "optim.power",
            "optim.lr_end",
            "optim.timescale",
            "optim.num_decay_steps",
            "optim.num_stable_steps",
            "optim.warmup_type",
            "optim.decay_type",
        ),
        "transformers' schedule of that name over max_steps updates (schedule_steps); "
        "constant_with_warmup is grpokit's "
        "constant, transformers' constant has no warm-up; a fractional warmup_steps is a share of max_steps; "
        "lr_scheduler_kwargs keys set the fields of the same name, except cosine_with_restarts' "
        "num_cycles: restart_cycles, "
        "min_lr: min_lr_rate = min_lr / learning_rate, min_lr_ratio: min_lr_rate (constant and constant_with_warmup "
        "ignore them, as transformers); reduce_lr_on_plateau and greedy are refused (they follow an evaluation metric)",
        lambda a, ctx: schedule_fields(a, trl_max_steps(a, ctx)),
    ),
    Rule(
        ("optim", "optim_args"),
        (
            "optim.optimizer",
            "optim.momentum",
            "optim.dampening",
            "optim.nesterov",
            "optim.lr_decay",
            "optim.rms_alpha",
            "optim.eps",
            "optim.centered",
        ),
        "adamw_torch(_fused): adamw; adafactor, sgd, adagrad, rmsprop: the same, as transformers' Trainer builds them "
        "(Adafactor on the learning rate and schedule, no relative step or parameter scaling); "
        "adamw_8bit (adamw_bnb_8bit), "
        "paged_adamw_8bit and bitsandbytes' others (paged_adamw_32bit, ademamix(_8bit), paged_ademamix_32bit/_8bit, "
        "lion_32bit/_8bit, paged_lion_32bit/_8bit, rmsprop_bnb(_8bit/_32bit): transformers' classes and defaults, no "
        "optim_args), adamw_torch_4bit and adamw_torch_8bit (torchao) when that "
        "package is installed; "
        "optim_args read as transformers: sgd momentum, dampening, nesterov; adagrad lr_decay, eps; rmsprop momentum, "
        "alpha (rms_alpha), eps, centered; their weight_decay key changes nothing, as in transformers (the parameter "
        "groups' weight_decay wins); the other optimizers read no optim_args, as transformers",
        lambda a, ctx: optimizer_fields(a),
    ),
]
