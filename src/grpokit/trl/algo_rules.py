"""The mapping's rules for the algorithm: KL, iterations, clipping, importance sampling, reward
scaling and weights, the loss type, the reference model's sync, and the entropy terms.

Rows of ``MAPPING`` (grpokit/trl/mapping.py), in the order docs/TRL.md shows them; their arithmetic
lives in loss_args.py.
"""

from __future__ import annotations

from typing import Any

from .config import GRPOConfig
from .loss_args import clip_fields, entropy_fields, loss_fields, objectives_fields
from .rule import Rule, copied, refuse
from .step_args import rounds_per


def _scale(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    if a.scale_rewards not in ("group", "batch", "none"):
        raise refuse("scale_rewards", a.scale_rewards, "group (True), batch, none (False)")
    return {"algo.scale": a.scale_rewards}


def _ref_sync(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    if not a.sync_ref_model:
        return {"algo.ref_refresh_every": 0}
    every = rounds_per(a.ref_model_sync_steps, a, ctx["world_size"])  # TRL counts optimizer steps, grpokit rounds
    return {"algo.ref_refresh_every": every, "algo.ref_mixup_alpha": a.ref_model_mixup_alpha}


ALGO_RULES: list[Rule] = [
    Rule(
        ("beta", "use_bias_correction_kl"),
        ("algo.beta", "algo.kl_bias_correction"),
        "copied; KL estimator k3 as TRL",
        lambda a, ctx: {
            "algo.beta": a.beta,
            "algo.kl_bias_correction": a.use_bias_correction_kl,
            "algo.kl_estimator": "k3",
        },
    ),
    Rule(("num_iterations",), ("algo.num_iterations",), "copied", copied(**{"algo.num_iterations": "num_iterations"})),
    Rule(
        ("epsilon", "epsilon_high", "delta"),
        ("algo.clip_low", "algo.clip_high", "algo.dual_clip"),
        "epsilon_high None: epsilon; delta (two-sided clipping, capping the ratio where A < 0) is dual_clip, "
        "only above 1 + epsilon_high (below it TRL's cap also clips A > 0)",
        clip_fields,
    ),
    Rule(
        ("importance_sampling_level",),
        ("algo.ratio_level",),
        "token or sequence (GSPO)",
        lambda a, ctx: {"algo.ratio_level": a.importance_sampling_level},
    ),
    Rule(
        ("scale_rewards",),
        ("algo.scale",),
        "group, batch, none (True: group, False: none); baseline group mean, unbiased std, eps 1e-4",
        lambda a, ctx: {**_scale(a, ctx), "algo.baseline": "group_mean", "algo.std": "unbiased", "algo.adv_eps": 1e-4},
    ),
    Rule(
        (
            "loss_type",
            "sapo_temperature_pos",
            "sapo_temperature_neg",
            "vespo_k_pos",
            "vespo_lambda_pos",
            "vespo_k_neg",
            "vespo_lambda_neg",
        ),
        (
            "algo.aggregation",
            "algo.objective",
            "algo.sapo_tau_pos",
            "algo.sapo_tau_neg",
            "algo.ratio_level",
            "algo.vespo_pos",
            "algo.vespo_neg",
        ),
        "grpo and sapo: seq-mean-token-mean, dapo, bnpo, cispo and vespo: token-mean, dr_grpo: "
        "seq-mean-token-sum-norm, "
        "luspo: seq-mean-token-sum (the clipped surrogate summed over each completion); "
        "cispo: objective cispo, clip_high = epsilon_high - 1 (TRL's epsilon_high is the weight's cap); "
        "sapo: objective sapo with the two temperatures; vespo: objective vespo at ratio_level trajectory "
        "(not with beta > 0 and use_bias_correction_kl; vLLM importance sampling in the token modes "
        "joins the weight, as TRL)",
        loss_fields,
    ),
    Rule(
        ("multi_objective_aggregation",),
        ("reward.normalize_components", "algo.scale"),
        "normalize_then_sum: normalize_components and scale batch_whiten (scale_rewards is then unused, as in TRL)",
        objectives_fields,
    ),
    Rule(
        ("reward_weights",),
        ("reward.weights",),
        "one weight per reward function, callables included",
        lambda a, ctx: {"reward.weights": list(a.reward_weights or [])},
    ),
    Rule(
        ("mask_truncated_completions",),
        ("algo.mask_truncated",),
        "copied",
        copied(**{"algo.mask_truncated": "mask_truncated_completions"}),
    ),
    Rule(
        ("sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps"),
        ("algo.ref_refresh_every", "algo.ref_mixup_alpha"),
        "every ref_model_sync_steps TRL steps (in grpokit steps: divided by the updates per round, at "
        "least 1), ref <- alpha * policy + (1 - alpha) * ref (alpha 1: a copy)",
        _ref_sync,
    ),
    Rule(
        ("top_entropy_quantile",),
        ("algo.entropy_top_fraction",),
        "copied; above 1 is 1 (every token: TRL masks only below 1)",
        lambda a, ctx: {"algo.entropy_top_fraction": min(a.top_entropy_quantile, 1.0)},
    ),
    Rule(
        (
            "entropy_coef",
            "use_adaptive_entropy",
            "entropy_coef_min",
            "entropy_coef_max",
            "entropy_coef_delta",
            "entropy_target",
        ),
        (
            "algo.entropy_coef",
            "algo.entropy_aggregation",
            "algo.entropy_adaptive",
            "algo.entropy_coef_min",
            "algo.entropy_coef_max",
            "algo.entropy_coef_delta",
            "algo.entropy_target",
        ),
        "entropy_aggregation token-mean, as TRL; use_adaptive_entropy is entropy_adaptive (TRL's code: the coefficient "
        "rises when the entropy is at or below the target, and the first step applies none)",
        entropy_fields,
    ),
]
