"""The TRL-compatible layer: ``from grpokit.trl import GRPOConfig, GRPOTrainer`` instead of
``from trl import GRPOConfig, GRPOTrainer``, with the names TRL's scripts import beside them
(``ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config`` ...) and
``grpokit.trl.rewards`` for ``trl.rewards``; none needs TRL installed. ``config.py`` holds TRL's
arguments, ``mapping.py`` turns them into a grpokit Config, ``trainer.py`` is the trainer,
``scripts.py`` and ``model_config.py`` the script helpers, ``script.py`` runs TRL's YAML and command line."""

from grpokit.trl.config import GRPOConfig
from grpokit.trl.progress import RichProgressCallback
from grpokit.trl.model_config import ModelConfig, get_kbit_device_map, get_peft_config, get_quantization_config
from grpokit.trl.scripts import (DatasetConfig, DatasetMixtureConfig, ScriptArguments, TrlParser, get_dataset,
                                 init_zero_verbose)
from grpokit.trl.trainer import GRPOTrainer, TrainOutput

__all__ = ["DatasetConfig", "DatasetMixtureConfig", "GRPOConfig", "GRPOTrainer", "ModelConfig", "RichProgressCallback", "ScriptArguments",
           "TrainOutput", "TrlParser", "get_dataset", "get_kbit_device_map", "get_peft_config",
           "get_quantization_config", "init_zero_verbose"]
