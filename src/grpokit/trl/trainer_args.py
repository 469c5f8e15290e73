"""GRPOTrainer's constructor arguments, checked and turned into grpokit's run.

``GRPOTrainer.__init__`` (grpokit/trl/trainer.py) calls these in order: the model's name and the
``GRPOConfig`` (refusing what grpokit cannot carry out, with one sentence), the ``Config`` it maps to
(grpokit/trl/mapping.py) with what the model object itself says (its dtype, its adapter), then the
process-wide settings TRL applies (dropout off, TF32). ``trl_rollout_func`` and the streamed-data
helpers give TRL's contracts their grpokit form.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

from grpokit.config.io import set_field
from grpokit.config.sections import Config, ConfigError
from grpokit.train import distributed
from grpokit.train.model_options import disable_dropout

from . import best
from .args.batch import prompts_per_round, rounds_for
from .config import GRPOConfig
from .contract.surface import accelerate_like_trl, refuse_vision_continuous_batching, warn_like_trl
from .inputs import adopt_peft_model, apply_lora, refuse_custom_code
from .mapping import to_config


def model_name(model: Any) -> str:
    """The model's name or path: the string itself, or an object's ``config._name_or_path`` ("model": none)."""
    if isinstance(model, str):
        return model
    return getattr(getattr(model, "config", None), "_name_or_path", "") or "model"


def checked_args(
    args: GRPOConfig | None, name: str, train_dataset, eval_dataset, quantization_config, optimizers: tuple
) -> GRPOConfig:
    """``args`` (TRL's default ``<model>-GRPO`` output folder when None), warned about and checked as
    TRL and accelerate would; the constructor arguments grpokit does not take are refused."""
    args = args if args is not None else GRPOConfig(f"{name.rstrip('/').split('/')[-1]}-GRPO")
    if not isinstance(args, GRPOConfig):
        raise ConfigError(
            f"args must be a grpokit.trl.GRPOConfig, got {type(args).__name__}; build it with the same arguments"
        )
    warn_like_trl(args)
    accelerate_like_trl(args, train_dataset, eval_dataset)
    best.check_args(args)
    if quantization_config is not None:
        raise ConfigError("GRPOTrainer argument quantization_config is not supported by grpokit; leave it None")
    if optimizers != (None, None):
        raise ConfigError(
            "GRPOTrainer argument optimizers is not supported by grpokit (it builds AdamW from the GRPOConfig); "
            "leave it (None, None)"
        )
    return args


def run_config(
    args: GRPOConfig,
    model: Any,
    name: str,
    processing_class: Any,
    peft_config: Any,
    num_rows: int,
    streamed: bool,
    num_funcs: int,
    episodes: bool = True,
) -> Config:
    """grpokit's Config for ``args`` (the mapping), the model's name, an object's dtype and adapter
    (or ``peft_config``'s LoRA); a model grpokit cannot run and a weight count that does not match
    the reward functions are refused."""
    cfg = to_config(args, num_rows=num_rows, streamed=streamed, episodes=episodes)
    set_field(cfg, "model.name_or_path", name)
    if isinstance(model, str):
        refuse_custom_code(model, cfg.model.trust_remote_code)
    refuse_vision_continuous_batching(args, model, processing_class, cfg.model.trust_remote_code)
    dtype = str(getattr(model, "dtype", "")).replace("torch.", "")
    if not isinstance(model, str) and dtype in ("float32", "bfloat16", "float16"):
        set_field(cfg, "model.dtype", dtype)  # an object keeps its dtype
    if getattr(model, "peft_config", None) is not None and not isinstance(model, str):
        adopt_peft_model(cfg, model, peft_config)
    elif peft_config is not None:
        apply_lora(cfg, peft_config, model)
    if cfg.reward.weights and len(cfg.reward.weights) != num_funcs:
        raise ConfigError(
            f"reward_weights has {len(cfg.reward.weights)} entries but there are {num_funcs} reward functions; "
            "give one weight per reward function"
        )
    return cfg


def apply_process_settings(args: GRPOConfig, model: Any) -> None:
    """What TRL sets at construction: a given model's dropout off (disable_dropout), TF32 matmuls (tf32)."""
    if args.disable_dropout and not isinstance(model, str):  # the run's build does it again (model.disable_dropout)
        disable_dropout(model)
    if args.tf32 is not None:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(args.tf32)


def trl_rollout_func(fn: Callable | None, facade: Any) -> Callable | None:
    """TRL's contract for ``rollout_func(prompts, trainer)``: every prompt repeated num_generations
    times (one completion per entry back), and the trainer is the GRPOTrainer (processing_class, args ...)."""
    if fn is None:
        return None
    G = facade.cfg.rollout.group_size

    def call(prompts: list, trainer: Any) -> dict:
        return fn([p for p in prompts for _ in range(G)], facade)

    return call


def is_stream(dataset) -> bool:
    """A datasets.IterableDataset: no length, so no epochs (transformers' loop runs on until max_steps)."""
    return type(dataset).__name__ == "IterableDataset"


def stream_rows(a: GRPOConfig) -> int | None:
    """Rows a streamed train_dataset must give for max_steps: prompts per sampling round times the rounds."""
    if a.max_steps <= 0:
        return None
    world = distributed.position()[1]
    return prompts_per_round(a, world) * rounds_for(a.max_steps, a, {"world_size": world, "streamed": True})


READ_AT_CONSTRUCTION = ("skip_memory_metrics", "disable_dropout")
"""GRPOConfig fields whose effect happened at construction and cannot be redone at train(): the memory tracker
of the "init" stage, and a given model's dropout already switched off."""


def snapshot(args: GRPOConfig) -> dict[str, Any]:
    """Every field's value, copied, to tell later which ones a script changed (a value that cannot be copied is
    kept as the object, so replacing it still shows)."""
    out = {}
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        try:
            out[f.name] = copy.deepcopy(value)
        except Exception:
            out[f.name] = value
    return out


def changed_fields(args: GRPOConfig, seen: dict[str, Any]) -> list[str]:
    """The fields of ``args`` whose value differs from ``seen`` (``snapshot``'s record), in declaration order."""
    out = []
    for name, was in seen.items():
        try:
            same = bool(getattr(args, name) == was)
        except Exception:  # a value without a plain == (an array): replaced or not
            same = getattr(args, name) is was
        if not same:
            out.append(name)
    return out


def refuse_late_changes(changed: list[str], built: bool) -> None:
    """One sentence for the changes to ``trainer.args`` that cannot be read: any once the run is built (train() or
    a first use of the trainer began it), and those ``READ_AT_CONSTRUCTION`` at any time."""
    names = ", ".join(changed)
    if built:
        raise ConfigError(
            f"GRPOConfig fields changed after the run was built ({names}): grpokit reads trainer.args once, when "
            "train() (or the first use of trainer.state, evaluate() ...) builds the run; set them before that, or "
            "build a new GRPOTrainer"
        )
    fixed = [n for n in changed if n in READ_AT_CONSTRUCTION]
    if fixed:
        raise ConfigError(
            f"GRPOConfig fields changed after GRPOTrainer(...) was constructed ({', '.join(fixed)}): they take effect "
            "at construction; pass them in the GRPOConfig given to GRPOTrainer"
        )
