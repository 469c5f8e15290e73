"""Stage 3 of a GRPO step: score every completion.

    from grpokit.rewards import RewardSpec, RewardRunner, resolve_reward
    specs = [RewardSpec(name="math_accuracy", weight=1.0), RewardSpec(name="strict_format", weight=0.2)]
    with RewardRunner(specs, num_workers=2, timeout_s=10.0) as runner:
        result = runner.score(prompts, completions, completion_ids, group_size=G, columns={"answer": golds})
    result.total_N, result.rewards_NF, result.metrics

Modules: spec (contract, registry), runner (parallel scoring, failure containment), values (a returned
value checked; one function's mean and std), errors (per-item failures vs infrastructure failures), calls
(a call's start-up, and what its completions caused, by kind), pool + pool_worker (killable, thread-safe
workers), answers (the one-answer rule against hedging), answer_limits (answers too big to check), math /
format / length (built-ins), code + sandbox/ (code execution), models (learned rewards), process_tree
(ending what rewards started).
See docs/REWARDS.md for every formula.
"""

from typing import Any

from .spec import BUILTINS, RewardError, RewardInfrastructureError, RewardSpec, resolve_reward

_LAZY = {"RewardRunner": "runner", "RewardResult": "runner", "GoldReport": "math", "validate_gold_answers": "math"}


def __getattr__(name: str) -> Any:
    # Lazy so that worker processes, which import reward functions by reference, do not import torch.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"grpokit.rewards.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'grpokit.rewards' has no attribute '{name}'")


__all__ = [
    "BUILTINS",
    "GoldReport",
    "RewardError",
    "RewardInfrastructureError",
    "RewardResult",
    "RewardRunner",
    "RewardSpec",
    "resolve_reward",
    "validate_gold_answers",
]
