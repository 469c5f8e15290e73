"""grpokit: train language models with GRPO and its family.

The package follows the seven stages of one GRPO step (see docs/ARCHITECTURE.md):
prompts (data) -> rollout -> rewards -> advantages -> loss -> update (train) -> record.

    from grpokit import Config, Trainer
    summary = Trainer(Config(), reward_funcs=[my_reward]).train()
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Config", "Trainer", "__version__"]


def __getattr__(name: str) -> Any:  # lazy: `import grpokit` stays cheap (no torch until needed)
    if name == "Config":
        from grpokit.config.sections import Config

        return Config
    if name == "Trainer":
        import importlib

        return getattr(importlib.import_module("grpokit.train"), name)
    raise AttributeError(f"module 'grpokit' has no attribute {name!r}")
