"""TRL's ``trl grpo`` for grpokit: ``grpokit trl grpo ARGS`` and ``grpokit train --config trl.yaml``.

Both read TRL's arguments with TRL's parser layout, ``TrlParser((GRPOScriptArguments, GRPOConfig,
ModelConfig, DatasetMixtureConfig))``: the flat names of a TRL YAML file (``model_name_or_path``,
``dataset_name``, ``reward_funcs``, ``learning_rate``, ``use_peft`` ...) or the same names as flags,
a flag over the file. Then they do what TRL's trl/scripts/grpo.py does: the reward functions by name
(TRL's four, from ``grpokit.trl.rewards``) or dotted import path (found in the working directory), an
optional reward model, the model's loading options from ModelConfig, the dataset by name (a hub id,
a local folder, or a .jsonl/.json/.parquet/.csv file) or the ``datasets`` mixture, the test split as
eval_dataset when evaluating; train, save the model to output_dir, push it when asked.

What TRL's CLI hands to ``accelerate launch`` instead (arguments no dataclass takes): ``num_processes``
runs that many processes with torchrun; any other launcher argument is refused in one sentence.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpokit.config.io import strict_yaml
from grpokit.config.sections import ConfigError

from ..config import GRPOConfig
from .model_config import ModelConfig, get_peft_config, get_quantization_config
from .model_flags import check_flags, init_kwargs, named_by_flags
from .parser import DatasetMixtureConfig, ScriptArguments, TrlParser, get_dataset

TRL_REWARD_NAMES = (
    "accuracy_reward",
    "reasoning_accuracy_reward",
    "think_format_reward",
    "get_soft_overlong_punishment",
)


@dataclass
class GRPOScriptArguments(ScriptArguments):
    """TRL's GRPO script arguments: the dataset's, plus a reward model and reward functions."""

    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Hub id or local folder of a sequence-classification reward model (scored before reward_funcs)."
        },
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions: accuracy_reward, reasoning_accuracy_reward, think_format_reward, "
            "get_soft_overlong_punishment (max_completion_len=1280, soft_punish_cache=256), or a dotted "
            "import path (my_module.my_reward) found from the working directory."
        },
    )


def make_parser(prog: str | None = None) -> TrlParser:
    return TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig), prog=prog)


@functools.cache
def argument_names() -> frozenset[str]:
    """The argument names ``trl grpo`` takes: a TRL YAML's keys (config/style.py tells the file's style by them)."""
    return frozenset(a.dest for a in make_parser()._actions)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``name=value`` overrides with TRL's names (values parsed as YAML)."""
    out = dict(data)
    for item in overrides:
        if "=" not in item or "." in item.split("=", 1)[0]:
            raise ConfigError(
                f"override {item!r} does not fit a TRL-style config; write name=value with a TRL argument name "
                "(e.g. learning_rate=1e-6)"
            )
        key, raw = item.split("=", 1)
        out[key.strip()] = strict_yaml(raw, f"override {item!r}") if raw != "" else None
    return out


def parse(argv: list[str] | None = None, config: dict[str, Any] | None = None) -> tuple[tuple, list[str]]:
    """``((script_args, training_args, model_args, dataset_args), launcher_args)`` from a TRL command line
    (``--config FILE`` included) or a TRL YAML mapping: what TRL's parser builds, and what TRL's CLI hands on
    to accelerate (arguments no dataclass takes)."""
    parser = make_parser(prog="grpokit trl grpo")
    env = dict((config or {}).pop("env", None) or {}) if config else {}
    for key, value in env.items():
        os.environ[key] = str(value)
    left = parser.set_defaults_with_config(**config) if config else []
    try:
        *objects, from_file, rest = parser.parse_args_and_config(
            list(argv or []), return_remaining_strings=True, separate_remaining_strings=True
        )
    except ValueError as e:  # a value the dataclasses refuse, as transformers words it
        raise ConfigError(" ".join(str(e).split())) from None
    return tuple(objects), left + list(from_file) + list(rest)


def launcher_processes(extra: list[str]) -> int:
    """The process count of TRL's launcher arguments (``--num_processes N``); others are refused."""
    n, i = 1, 0
    while i < len(extra):
        name, _, value = extra[i].partition("=")
        if name == "--num_processes":
            if not value:
                i += 1
                value = extra[i] if i < len(extra) else ""
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"num_processes={value!r} is not valid; use an integer >= 1")
            n = int(value)
        else:
            raise ConfigError(
                f"{extra[i]!r} is not an argument of trl grpo's script, GRPOConfig or ModelConfig, and of "
                "TRL's launcher arguments grpokit takes only num_processes (for others run torchrun yourself)"
            )
        i += 1
    return n


def build_trainer(
    script_args: Any,
    training_args: GRPOConfig,
    model_args: ModelConfig,
    dataset_args: DatasetMixtureConfig,
    callbacks: list | None = None,
):
    """The ``GRPOTrainer`` trl/scripts/grpo.py builds from these arguments."""
    from ..trainer import GRPOTrainer

    if not model_args.model_name_or_path:
        raise ConfigError("no model_name_or_path; name the model to train")
    funcs = ([script_args.reward_model_name_or_path] if script_args.reward_model_name_or_path else []) + [
        _reward(name) for name in script_args.reward_funcs or []
    ]
    check_flags(model_args, training_args.model_init_kwargs)
    training_args.model_init_kwargs = init_kwargs(model_args, training_args)  # the user's keys win, as TRL's
    splits = _datasets(script_args, dataset_args)
    evaluate = training_args.eval_strategy != "no"
    for split in [script_args.dataset_train_split] + ([script_args.dataset_test_split] if evaluate else []):
        if split not in splits:
            raise ConfigError(
                f"the dataset has no {split!r} split (it has {', '.join(splits) or 'none'}); set "
                f"dataset_train_split / dataset_test_split{', or eval_strategy=no' if evaluate else ''}"
            )
    with named_by_flags(model_args):  # a refused LoRA setting names its flag (--use_rslora)
        return GRPOTrainer(
            model=model_args.model_name_or_path,
            reward_funcs=funcs,
            args=training_args,
            train_dataset=splits[script_args.dataset_train_split],
            eval_dataset=splits[script_args.dataset_test_split] if evaluate else None,
            quantization_config=get_quantization_config(model_args),
            peft_config=get_peft_config(model_args),
            callbacks=callbacks,
        )


def build_and_train(objects: tuple, say, source: str, resume_from_checkpoint: Any = None) -> tuple[Any, Any]:
    """``(trainer, train()'s result)`` of the parsed ``objects``, the run folder said first (``source``: where the
    arguments came from). The run is built in train() too, so a refused LoRA setting names its flag there as well."""
    with named_by_flags(objects[2]):
        trainer = build_trainer(*objects)
        say(f"grpokit: run folder {trainer.run_dir} ({source})", flush=True)
        return trainer, trainer.train(resume_from_checkpoint=resume_from_checkpoint)


def run(objects: tuple, say=print) -> Any:
    """Train as trl/scripts/grpo.py's main(): train, save the model to output_dir, push it when asked.
    A run a signal stopped (docs/FAULTS.md) keeps its checkpoint and is neither saved nor pushed. Returns the
    trainer."""
    script_args, training_args = objects[0], objects[1]
    trainer, result = build_and_train(objects, say, "TRL arguments")
    if trainer.summary.get("interrupted"):
        return trainer
    trainer.save_model(training_args.output_dir)
    say(f"grpokit: {result.global_step} steps; model saved to {training_args.output_dir}", flush=True)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    return trainer


def main(argv: list[str], say=print, stopped=None) -> int:
    """``grpokit trl grpo ARGS``: TRL's ``trl grpo`` arguments; ``--num_processes N`` re-runs under torchrun.
    ``stopped(summary, steps, run_dir) -> status`` reports a run a signal stopped (the CLI's 128 + N)."""
    objects, extra = parse(argv)
    processes = launcher_processes(extra)
    if processes > 1 and "LOCAL_RANK" not in os.environ:
        kept = _without_launcher(argv)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={processes}",
            "-m",
            "grpokit",
            "trl",
            "grpo",
            *kept,
        ]
        return subprocess.call(cmd)
    trainer = run(objects, say)
    if trainer.summary.get("interrupted") and stopped is not None:
        return stopped(trainer.summary, trainer.cfg.train.steps, Path(trainer.run_dir))
    return 0


def _without_launcher(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--num_processes":
            skip = True
        elif not a.startswith("--num_processes="):
            out.append(a)
    return out


def _datasets(script_args: Any, dataset_args: DatasetMixtureConfig) -> Any:
    import logging

    if dataset_args.datasets:
        if script_args.dataset_name:
            logging.getLogger("grpokit.trl").warning(
                "both datasets and dataset_name are given; the datasets mixture is used"
            )
        return get_dataset(dataset_args)
    if not script_args.dataset_name:
        raise ConfigError(
            "no dataset: give dataset_name (a hub id, a local folder or a .jsonl/.json/.parquet/.csv file) "
            "or a datasets mixture"
        )
    return _load(script_args.dataset_name, script_args.dataset_config, script_args.dataset_streaming)


def _load(name: str, config: str | None, streaming: bool) -> Any:
    import datasets

    from grpokit.data.prompts import FILE_BUILDERS

    path = Path(name).expanduser()
    if path.suffix in FILE_BUILDERS:  # one local file: its one split is "train"
        if not path.is_file():
            raise ConfigError(
                f"dataset_name={name!r} does not exist; give an existing .jsonl/.json/.parquet/.csv file, "
                "a folder or a hub dataset"
            )
        return datasets.load_dataset(FILE_BUILDERS[path.suffix], data_files=str(path), streaming=streaming)
    try:
        return datasets.load_dataset(name, name=config, streaming=streaming)
    except Exception as e:  # network, unknown name: one sentence
        raise ConfigError(
            f"could not load dataset {name!r} ({type(e).__name__}: {' '.join(str(e).split())[:300]})"
        ) from None


def _reward(name: str):
    from .. import rewards

    if name in TRL_REWARD_NAMES:  # TRL's registry, with its fixed overlong settings
        if name == "get_soft_overlong_punishment":
            return rewards.get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)
        return getattr(rewards, name)
    from grpokit.rewards.spec import BUILTINS, RewardError, resolve_reward

    if ":" not in name and name not in BUILTINS:
        if "." not in name:
            raise ConfigError(
                f"reward_funcs entry {name!r} is not one of {', '.join(TRL_REWARD_NAMES)}, a grpokit "
                f"built-in ({', '.join(BUILTINS)}) or a dotted import path"
            )
        module, _, attr = name.rpartition(".")
        name = f"{module}:{attr}"  # TRL's dotted path
    if os.getcwd() not in sys.path:  # as TRL's script: a reward module beside the run
        sys.path.insert(0, os.getcwd())
    try:
        return resolve_reward(name)
    except RewardError as e:
        raise ConfigError(f"reward_funcs: {e}") from None
