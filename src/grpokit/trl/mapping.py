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
import os

from grpokit.config.io import set_field
from grpokit.config.sections import Config

from .algo_rules import ALGO_RULES
from .checks import check_gated
from .config import SUPPORTED, UNSUPPORTED, GRPOConfig
from .model_rules import MODEL_RULES
from .rule import Rule
from .run_args import RUN_MANAGEMENT
from .run_rules import RUN_RULES
from .step_args import steps_fields
from .training_rules import TRAINING_RULES

MAPPING: list[Rule] = [*TRAINING_RULES, *MODEL_RULES, *ALGO_RULES, *RUN_RULES]
HANDLED_ELSEWHERE = {  # arguments the trainer itself carries out (grpokit/trl/trainer.py)
    "push_to_hub": "GRPOTrainer pushes the final model (and, with hub_strategy every_save, each checkpoint)",
    "hub_model_id": "repository of push_to_hub (None: output_dir's name)",
    "hub_token": "token of push_to_hub",
    "hub_private_repo": "private flag of push_to_hub",
    "remove_unused_columns": "True drops every dataset column but prompt",
    "disable_dropout": "sets the policy's dropout probabilities to 0",
    "per_device_eval_batch_size": "completions per batch of evaluate()",
    "num_generations_eval": "completions per eval prompt in evaluate() (None: num_generations)",
    "eval_on_start": "evaluate() before the first step",
    "logging_first_step": "log_history also gets step 1",
    "resume_from_checkpoint": "train() resumes from it when called without one",
    "tf32": "sets torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32 (None: unchanged)",
    "dataloader_num_workers": "no effect: grpokit holds the prompts in memory, there is no DataLoader",
    "dataloader_pin_memory": "no effect (no DataLoader)",
    "dataloader_persistent_workers": "no effect (no DataLoader)",
    "dataloader_prefetch_factor": "no effect (no DataLoader)",
    "accelerator_config": "no effect: it configures accelerate's DataLoader dispatch; grpokit uses neither",
    "pad_to_multiple_of": "no effect: padding changes no log-prob, loss or "
    "gradient; grpokit pads or packs as it chooses",
    "log_unique_prompts": "no effect: samples.jsonl already holds each prompt once with its group",
    "enable_jit_checkpoint": "True: what grpokit's loop always does on SIGTERM: the step in progress finishes "
    "(train.stop_grace_s) and a checkpoint of the last finished step is written (train/stopping.py); refused with "
    "save_strategy no or save_steps <= 0, where transformers still writes one and grpokit does not",
    "vllm_group_port": "not read (as TRL without use_vllm and vllm_mode server); with them only TRL's default "
    "51216: grpokit's server client has no NCCL group",
}
HANDLED_ELSEWHERE.update(RUN_MANAGEMENT)
HANDLED_ELSEWHERE.update(
    {  # transformers' Trainer behaviours, carried out by GRPOTrainer with transformers' meaning
        "logging_nan_inf_filter": "True: a NaN or inf step loss is logged (and counted in train_loss) as the log "
        "window's running loss, as transformers; False: as is (grpokit skips the update of a non-finite step, "
        "where transformers applies it)",
        "skip_memory_metrics": "False: transformers' TrainerMemoryTracker adds init_/train_/eval_mem_* deltas to "
        "train()'s and evaluate()'s metrics (the model load counts in the first of them: grpokit loads it then)",
        "restore_callback_states_from_checkpoint": "checkpoints hold the ExportableState callbacks' states "
        "(stateful_callbacks); True: a resumed run rebuilds those callbacks from them, as transformers",
    }
)
HANDLED_ELSEWHERE.update(
    {  # accepted with no effect, as in TRL's GRPO (its trainer overrides what reads them)
        "use_transformers_continuous_batching": "sampling with continuous batching: "
        "grpokit's own decode loop, which drops "
        "finished rows from the batch (same distribution); refused for a vision model, as TRL",
        "transformers_continuous_batching_config": "checked as transformers' "
        "ContinuousBatchingConfig keywords; sizes "
        "a paged "
        "cache grpokit's decode loop does not have",
        "use_transformers_paged": "deprecated alias: True sets "
        "use_transformers_continuous_batching, with TRL's "
        "FutureWarning",
        "label_smoothing_factor": "no effect, as TRL: transformers applies it in "
        "Trainer.compute_loss, which GRPOTrainer replaces",
        "liger_kernel_config": "no effect: with use_liger_kernel grpokit applies liger-kernel's RMSNorm, SwiGLU and "
        "RoPE kernels (model.kernels); its fused loss is never needed (grpokit's output layer is chunked)",
        "prediction_loss_only": "no effect, as TRL: GRPO's prediction_step returns the loss only",
        "eval_do_concat_batches": "no effect, as TRL (no predictions)",
        "eval_use_gather_object": "no effect, as TRL (no predictions)",
        "eval_accumulation_steps": "no effect, as TRL (no predictions)",
        "include_for_metrics": "no effect, as TRL (GRPOTrainer takes no compute_metrics)",
        "batch_eval_metrics": "no effect, as TRL (GRPOTrainer takes no compute_metrics)",
        "dataloader_drop_last": "no effect, as TRL: its RepeatSampler yields whole generation batches only",
        "dataloader_multiprocessing_context": "no effect (no DataLoader workers)",
        "label_names": "no effect, as TRL (GRPO inputs carry no labels)",
        "train_sampling_strategy": "no effect, as TRL: RepeatSampler replaces "
        "transformers' sampler (shuffle_dataset decides)",
        "length_column_name": "no effect, as TRL (group_by_length's column; RepeatSampler does not read it)",
        "ds3_gather_for_generation": "no effect: DeepSpeed ZeRO-3 only (deepspeed is refused)",
        "log_multimodal": "no effect: samples.jsonl keeps text, never images",
        "local_rank": "no effect: the rank comes from LOCAL_RANK, as transformers when it is set",
        "log_on_each_node": "grpokit logs on global rank 0 only (log_on_each_node=False); one node: the same",
        "dataloader_in_order": "no effect (no DataLoader workers)",
        "ddp_find_unused_parameters": "no effect: grpokit all-reduces gradients "
        "itself, no DistributedDataParallel wrapper",
        "ddp_bucket_cap_mb": "no effect (no DistributedDataParallel wrapper)",
        "ddp_broadcast_buffers": "no effect (no DistributedDataParallel wrapper)",
        "ddp_static_graph": "no effect (no DistributedDataParallel wrapper)",
    }
)
FIXED = {
    "data.task": "",
    "data.dataset": "",
    "data.eval_dataset": "",
    "reward.functions": [],
    "reward.convention": "trl",
    "reward.num_workers": 0,
}  # grpokit fields the TRL layer always sets (FIXED_DOC says why)


def to_config(args: GRPOConfig, *, num_rows: int, world_size: int | None = None, streamed: bool = False) -> Config:
    """The grpokit ``Config`` of a TRL ``GRPOConfig`` (``num_rows``: training prompts, for epochs;
    ``streamed``: an IterableDataset, which has no epochs)."""
    ctx = {
        "num_rows": num_rows,
        "world_size": world_size or int(os.environ.get("WORLD_SIZE", "1")),
        "streamed": streamed,
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
        args = "<br>".join(f"`{n}` ({defaults[n]!r})" for n in rule.args)
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
convention and run in the trainer's process."""
