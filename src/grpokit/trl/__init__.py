"""The TRL-compatible layer: ``from grpokit.trl import GRPOConfig, GRPOTrainer`` instead of
``from trl import GRPOConfig, GRPOTrainer``. ``config.py`` holds TRL's arguments, ``mapping.py``
turns them into a grpokit Config, ``trainer.py`` is the trainer, ``script.py`` runs TRL's YAML.
``reasoning_gym_dataset`` and ``reasoning_gym_accuracy`` give reasoning-gym's tasks as a dataset and
a reward function (docs/TASKS.md); they work with TRL's own GRPOTrainer as well."""

from grpokit.data.tasks.reasoning_gym import dataset as reasoning_gym_dataset
from grpokit.data.tasks.reasoning_gym import reasoning_gym_accuracy
from grpokit.trl.config import GRPOConfig
from grpokit.trl.trainer import GRPOTrainer, TrainOutput

__all__ = ["GRPOConfig", "GRPOTrainer", "TrainOutput", "reasoning_gym_dataset", "reasoning_gym_accuracy"]
