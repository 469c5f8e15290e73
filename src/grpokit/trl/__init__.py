"""The TRL-compatible layer: ``from grpokit.trl import GRPOConfig, GRPOTrainer`` instead of
``from trl import GRPOConfig, GRPOTrainer``. ``config.py`` holds TRL's arguments, ``mapping.py``
turns them into a grpokit Config, ``trainer.py`` is the trainer, ``script.py`` runs TRL's YAML."""

from grpokit.trl.config import GRPOConfig
from grpokit.trl.trainer import GRPOTrainer, TrainOutput

__all__ = ["GRPOConfig", "GRPOTrainer", "TrainOutput"]
