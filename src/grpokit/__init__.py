"""grpokit: train language models with GRPO and its family.

The package follows the seven stages of one GRPO step (see docs/ARCHITECTURE.md):
prompts (data) -> rollout -> rewards -> advantages -> loss -> update (train) -> record.
"""

__version__ = "0.1.0"
