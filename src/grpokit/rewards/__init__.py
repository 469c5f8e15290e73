"""Stage 3 of a GRPO step: score every completion.

    from grpokit.rewards import RewardSpec, RewardRunner, resolve_reward
    specs = [RewardSpec(name="math_accuracy", weight=1.0), RewardSpec(name="strict_format", weight=0.2)]
    with RewardRunner(specs, num_workers=2, timeout_s=10.0) as runner:
        result = runner.score(prompts, completions, completion_ids, group_size=G, columns={"answer": golds})
    result.total_N, result.rewards_NF, result.metrics

Modules: spec (contract, registry), runner (parallel scoring, failure containment), pool (killable
workers), math / format / length (built-ins), code + sandbox/ (code execution), models (learned rewards).
See docs/REWARDS.md for every formula.
"""
from grpokit.rewards.math import GoldReport, validate_gold_answers
from grpokit.rewards.runner import RewardResult, RewardRunner
from grpokit.rewards.spec import BUILTINS, RewardError, RewardSpec, resolve_reward

__all__ = ["BUILTINS", "GoldReport", "RewardError", "RewardResult", "RewardRunner", "RewardSpec",
           "resolve_reward", "validate_gold_answers"]
