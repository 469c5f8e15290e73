"""The TRL-compatible layer: ``from grpokit.trl import GRPOConfig, GRPOTrainer`` instead of
``from trl import GRPOConfig, GRPOTrainer``, with the names TRL's scripts import beside them
(``ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config`` ...) and
``grpokit.trl.rewards`` for ``trl.rewards``; none needs TRL installed. Every other public name and module
of trl is trl's own (``grpokit.trl.SFTConfig``, ``grpokit.trl.trainer.sft_trainer``, upstream.py), so a
project changes ``import trl`` once. ``config.py`` declares TRL's
arguments, ``args/`` holds each group's mapping and checks, ``mapping.py`` turns them into a grpokit
Config, ``trainer.py`` is the trainer, ``contract/`` TRL's extension contract, ``scripts/`` the script
helpers and ``trl grpo``.
``reasoning_gym_dataset`` and ``reasoning_gym_accuracy`` give reasoning-gym's tasks as a dataset and
a reward function (docs/TASKS.md); they work with TRL's own GRPOTrainer as well."""

import sys

from grpokit.data.tasks.reasoning_gym import dataset as reasoning_gym_dataset
from grpokit.data.tasks.reasoning_gym import reasoning_gym_accuracy
from grpokit.trl.config import GRPOConfig
from grpokit.trl.distillation import DistillationConfig, DistillationTrainer
from grpokit.trl.scripts.model_config import ModelConfig, get_kbit_device_map, get_peft_config, get_quantization_config
from grpokit.trl.scripts.parser import (
    DatasetConfig,
    DatasetMixtureConfig,
    ScriptArguments,
    TrlParser,
    get_dataset,
    init_zero_verbose,
)
from grpokit.trl.scripts.progress import RichProgressCallback
from grpokit.trl.trainer import GRPOTrainer, TrainOutput
from grpokit.trl.upstream import install as _install_upstream

__all__ = [
    "DatasetConfig",
    "DatasetMixtureConfig",
    "DistillationConfig",
    "DistillationTrainer",
    "GRPOConfig",
    "GRPOTrainer",
    "ModelConfig",
    "RichProgressCallback",
    "ScriptArguments",
    "TrainOutput",
    "TrlParser",
    "get_dataset",
    "get_kbit_device_map",
    "get_peft_config",
    "get_quantization_config",
    "init_zero_verbose",
    "reasoning_gym_dataset",
    "reasoning_gym_accuracy",
]

_install_upstream(sys.modules[__name__])  # trl's other names and modules, found when first used
