"""grpokit: train language models with GRPO and its family.

The package follows the seven stages of one GRPO step (see docs/ARCHITECTURE.md):
prompts (data) -> rollout -> rewards -> advantages -> loss -> update (train) -> record.

    from grpokit import Config, Trainer
    summary = Trainer(Config(), reward_funcs=[my_reward]).train()
"""

from typing import Any

from grpokit.version import __version__

__all__ = ["Config", "Trainer", "__version__"]


def __getattr__(name: str) -> Any:  # lazy: `import grpokit` stays cheap (no torch until needed)
    if name == "Config":
        from grpokit.config.sections import Config

        return Config
    if name == "Trainer":
        from grpokit.train.loop import Trainer

        return Trainer
    raise AttributeError(f"module 'grpokit' has no attribute {name!r}")
