"""The mapping's rules for the run around the math: model options, compilation, tools, logging and
samples, processes (DDP timeout, FSDP) and evaluation.

Rows of ``MAPPING`` (grpokit/trl/mapping.py), in the order docs/TRL.md shows them.
"""

from __future__ import annotations

import math
import os
from typing import Any

from .checks import GATES
from .config import GRPOConfig
from .rule import Rule, every_steps, refuse
from .step_args import epoch_rounds


def _logging(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    reports = [a.report_to] if isinstance(a.report_to, str) or a.report_to is None else list(a.report_to)
    reports = [r for r in reports if r not in (None, "none")]
    trackers = ("tensorboard", "wandb", "mlflow", "trackio")
    bad = [r for r in reports if r not in trackers]
    if bad:
        raise refuse("report_to", a.report_to, "none or a list of " + ", ".join(trackers))
    hosted = {
        n: getattr(a, n) for n in ("trackio_space_id", "trackio_bucket_id", "trackio_static_space_id") if getattr(a, n)
    }
    if hosted and "trackio" in reports:  # without trackio reporting transformers never reads them, nor does grpokit
        name, value = next(iter(hosted.items()))
        raise refuse(
            name,
            value,
            "None with report_to trackio (grpokit's Trackio sink logs to the local database "
            "only, it hosts no Space or bucket); drop trackio from report_to to keep the value",
        )
    if a.logging_strategy not in ("steps", "epoch", "no"):
        raise refuse("logging_strategy", a.logging_strategy, "steps, epoch, no")
    every = epoch_rounds(a, ctx) if a.logging_strategy == "epoch" else every_steps(a.logging_steps, ctx["steps"])
    return {
        "record.sinks": ([] if a.disable_tqdm else ["console"]) + reports,
        "record.console_every": every,
        "record.run_name": a.run_name or "",
        "record.project": a.project if "trackio" in reports else "",
        "record.samples_every": every if a.log_completions else 0,
    }


def _eval(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    if a.eval_strategy not in ("no", "steps", "epoch"):
        raise refuse("eval_strategy", a.eval_strategy, "no, steps, epoch")
    return {
        "train.eval_every": 0
    }  # GRPOTrainer.evaluate() runs at TRL's eval steps or epoch ends (grpokit/trl/bridge.py)


_FSDP_DEFAULTS = {
    ("fsdp_version", 2),
    ("version", 2),
    ("reshard_after_forward", True),
    ("min_num_params", 0),
    ("xla", False),
    ("xla_fsdp_v2", False),
    ("xla_fsdp_grad_ckpt", False),
}


def _fsdp(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    opts = (
        a.fsdp.split()
        if isinstance(a.fsdp, str)
        else ([] if a.fsdp in (None, False) else ["full_shard"] if a.fsdp is True else list(a.fsdp))
    )
    if opts and (opts[0] != "full_shard" or set(opts[1:]) - {"auto_wrap"}):
        raise refuse(
            "fsdp", a.fsdp, "None, True, 'full_shard' or 'full_shard auto_wrap' (grpokit's FSDP2 shards fully)"
        )
    cfg = {k: v for k, v in (a.fsdp_config or {}).items() if (k, v) not in _FSDP_DEFAULTS}
    if cfg:
        raise refuse("fsdp_config", a.fsdp_config, "None, {} or {'fsdp_version': 2}")
    return {"train.fsdp": bool(opts)}


def _samples(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    n = a.num_completions_to_print
    # <= 0: TRL prints none; grpokit prints no completions anyway and keeps its samples.jsonl
    return {} if n is None or n <= 0 else {"record.samples_prompts": math.ceil(n / a.num_generations)}


def _save_on_each_node(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    # one node: its main process is global rank 0, where grpokit saves, so True and False write the same files
    if a.save_on_each_node and ctx["world_size"] > int(os.environ.get("LOCAL_WORLD_SIZE", ctx["world_size"])):
        raise refuse(
            "save_on_each_node",
            True,
            "False on several nodes (grpokit saves on global rank 0, for a filesystem every node reads); "
            "on one node either value",
        )
    return {}


RUN_RULES: list[Rule] = [
    Rule(
        ("save_on_each_node",),
        (),
        "one node: the same as False (the node's main process is rank 0, where grpokit saves); on several "
        "nodes True is refused",
        _save_on_each_node,
    ),
    Rule(
        ("cast_lm_head_to_fp32", "neftune_noise_alpha", "router_aux_loss_coef"),
        ("model.lm_head_fp32", "model.neftune_noise_alpha", "model.router_aux_loss_coef"),
        "copied; neftune_noise_alpha None: 0 (off), noise during the whole training step as TRL (generation included); "
        "router_aux_loss_coef None: -1 (the MoE model config's own, 0 for other models)",
        lambda a, ctx: {
            "model.lm_head_fp32": a.cast_lm_head_to_fp32,
            "model.neftune_noise_alpha": a.neftune_noise_alpha or 0.0,
            "model.router_aux_loss_coef": -1.0 if a.router_aux_loss_coef is None else a.router_aux_loss_coef,
        },
    ),
    Rule(
        ("torch_compile", "torch_compile_backend", "torch_compile_mode"),
        ("model.compile", "model.compile_backend", "model.compile_mode"),
        "the backbone of the log-probability passes (old log-probs, update) through torch.compile, sampling eager; "
        "backend None: inductor, mode None: default; a backend or mode set turns it on, as transformers",
        lambda a, ctx: {
            "model.compile": bool(a.torch_compile or a.torch_compile_backend or a.torch_compile_mode),
            "model.compile_backend": a.torch_compile_backend or "inductor",
            "model.compile_mode": a.torch_compile_mode or "default",
        },
    ),
    Rule(
        ("use_liger_kernel",),
        ("model.kernels",),
        "True: auto (liger-kernel's RMSNorm, SwiGLU and RoPE kernels where it is installed and the device is "
        "CUDA, the model's own code otherwise; the same math up to the model dtype's rounding). Liger's fused "
        "loss is not needed: grpokit's output layer never holds the full logits (equal losses, "
        "tests/project/test_bench_loss_equality.py)",
        lambda a, ctx: {"model.kernels": "auto" if a.use_liger_kernel else "torch"},
    ),
    Rule(
        ("off_policy_mask_threshold",),
        ("algo.offpolicy_delta",),
        "None: 0 (off); TRL's 0 is a threshold (negative-advantage completions whose mean log-ratio is above 0 "
        "leave the loss): the smallest positive float (no log-ratio lies between it and 0)",
        lambda a, ctx: {"algo.offpolicy_delta": offpolicy_delta(a.off_policy_mask_threshold)},
    ),
    Rule(
        ("max_tool_calling_iterations",),
        ("env.max_turns",),
        "model turns = iterations + 1; None keeps env.max_turns",
        lambda a, ctx: (
            {} if a.max_tool_calling_iterations is None else {"env.max_turns": a.max_tool_calling_iterations + 1}
        ),
    ),
    Rule(
        (
            "report_to",
            "logging_steps",
            "log_completions",
            "disable_tqdm",
            "run_name",
            "logging_strategy",
            "project",
            "trackio_space_id",
            "trackio_bucket_id",
            "trackio_static_space_id",
        ),
        ("record.sinks", "record.console_every", "record.samples_every", "record.run_name", "record.project"),
        "report_to trackers join the console; log_completions writes samples.jsonl every logging_steps; project is "
        "the Trackio project with report_to trackio (as transformers; other trackers keep grpokit's); "
        "trackio_space_id, "
        "trackio_bucket_id and trackio_static_space_id are accepted when nothing reports to trackio "
        "(transformers reads "
        "them in its Trackio callback only), refused with it (grpokit's Trackio sink hosts no Space); "
        "logging_strategy=epoch "
        "logs at the end of every epoch and of training (logging_first_step still logs step 1, as transformers)",
        _logging,
    ),
    Rule(
        ("num_completions_to_print",),
        ("record.samples_prompts",),
        "whole groups: ceil(num_completions_to_print / num_generations) prompts per sample dump (None or <= 0: "
        "grpokit's 2; TRL prints none at <= 0, grpokit prints no completions to the console)",
        _samples,
    ),
    Rule(
        ("ddp_timeout",),
        ("train.dist_timeout_s",),
        "copied: the process group's timeout under torchrun, as transformers (one process: not read, as transformers); "
        "several processes as its range check reads them (checks.GATES: the GRPOConfig's world_size)",
        lambda a, ctx: {"train.dist_timeout_s": a.ddp_timeout} if GATES["ddp_timeout"].on(a) else {},
    ),
    Rule(
        ("fsdp", "fsdp_config"),
        ("train.fsdp",),
        "full_shard (auto_wrap or not) or True: FSDP2 (grpokit wraps each decoder layer); fsdp_config "
        "only fsdp_version 2",
        _fsdp,
    ),
    Rule(
        ("eval_strategy", "eval_steps"),
        ("train.eval_every",),
        "GRPOTrainer.evaluate() every eval_steps TRL steps (None: logging_steps), or with "
        "eval_strategy=epoch at the end of "
        "every epoch and of training (eval_delay counts epochs then, as transformers); grpokit's own "
        "greedy evaluation is off",
        _eval,
    ),
]


def offpolicy_delta(threshold: float | None) -> float:
    """grpokit's ``algo.offpolicy_delta`` for TRL's off_policy_mask_threshold. grpokit reads 0 as "off", TRL
    as an active threshold (a sequence is dropped when its mean log-ratio is > 0): TRL's 0 becomes the smallest
    positive float, 5e-324, as no float32 or bfloat16 log-ratio lies in (0, 5e-324] (and a float64 one only at
    5e-324 itself), so ``drift > 5e-324`` drops exactly what ``drift > 0`` drops; None is off."""
    if threshold is None:
        return 0.0
    return math.ulp(0.0) if threshold == 0 else float(threshold)
