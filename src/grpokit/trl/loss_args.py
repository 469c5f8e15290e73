"""The TRL arguments that choose the loss: loss_type (with its cispo / sapo / vespo settings),
epsilon / epsilon_high / delta, the entropy bonus (static or adaptive) and multi_objective_aggregation
-> grpokit's algo and reward fields.

Part of mapping.py's table (its rules call these); kept apart so each file stays readable. The
values are checked against TRL's own loss code in tests/project/test_bench_loss_equality.py.
"""

from __future__ import annotations

from typing import Any

from grpokit.config.sections import ConfigError

from .config import GRPOConfig


def _refuse(name: str, value: Any, valid: str) -> ConfigError:
    return ConfigError(f"GRPOConfig argument {name}={value!r} is not supported by grpokit; valid: {valid}")


_AGGREGATION = {
    "grpo": "seq-mean-token-mean",
    "dapo": "token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "cispo": "token-mean",
    "sapo": "seq-mean-token-mean",
    "luspo": "seq-mean-token-sum",
    "vespo": "token-mean",
}  # TRL normalises cispo/vespo as dapo, sapo as grpo


def loss_fields(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    if a.loss_type not in _AGGREGATION:
        raise _refuse("loss_type", a.loss_type, ", ".join(_AGGREGATION))
    out = {
        "algo.aggregation": _AGGREGATION[a.loss_type],
        "algo.norm_constant": 0.0,
    }  # dr_grpo: 0 = max_completion_length
    if a.loss_type == "cispo":  # TRL caps the IS weight at epsilon_high itself; grpokit's cap is 1 + clip_high
        # unset, TRL's cap is epsilon (0.2 by default): every weight at most 0.2, as TRL's code does (its
        # docs suggest 5.0)
        cap = a.epsilon if a.epsilon_high is None else a.epsilon_high
        out |= {"algo.objective": "cispo", "algo.clip_high": cap - 1.0}
    elif a.loss_type == "sapo":
        out |= {
            "algo.objective": "sapo",
            "algo.sapo_tau_pos": a.sapo_temperature_pos,
            "algo.sapo_tau_neg": a.sapo_temperature_neg,
        }
    elif a.loss_type == "vespo":
        out |= _vespo(a)
    return out


def _vespo(a: GRPOConfig) -> dict[str, Any]:
    """VESPO weighs a completion by its whole-sequence ratio (grpokit's trajectory level, whatever
    importance_sampling_level says: TRL uses that level only for the KL's importance weight)."""
    if a.beta != 0.0 and a.use_bias_correction_kl:
        raise ConfigError(
            f"GRPOConfig loss_type='vespo' with beta={a.beta!r} and use_bias_correction_kl=True is not "
            "supported by grpokit (its VESPO ratio is per sequence, TRL's KL weight per token); "
            "set use_bias_correction_kl=False or beta=0"
        )
    if (
        a.use_vllm
        and a.vllm_importance_sampling_correction
        and a.vllm_importance_sampling_mode not in ("token_truncate", "token_mask")
    ):
        # TRL's own check and words; in the token modes the sampler's ratio joins VESPO's weight (algo/vespo.py)
        raise ConfigError(
            "VESPO loss requires `vllm_importance_sampling_mode` to be either 'token_truncate' or "
            f"'token_mask'. Got: {a.vllm_importance_sampling_mode}."
        )
    return {
        "algo.objective": "vespo",
        "algo.ratio_level": "trajectory",
        "algo.vespo_pos": [a.vespo_k_pos, a.vespo_lambda_pos],
        "algo.vespo_neg": [a.vespo_k_neg, a.vespo_lambda_neg],
    }


def clip_fields(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    high = a.epsilon if a.epsilon_high is None else a.epsilon_high
    out = {"algo.clip_low": a.epsilon, "algo.clip_high": high, "algo.dual_clip": 0.0}
    if a.delta is not None:  # TRL's two-sided clipping caps the ratio at delta: dual-clip PPO's bound for A < 0
        if a.loss_type not in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
            raise ConfigError(
                f"GRPOConfig delta={a.delta!r} bounds the clipped loss types only, not loss_type={a.loss_type!r}; "
                "set delta=None"
            )
        if a.delta <= 1.0 + high:
            raise ConfigError(
                f"GRPOConfig delta={a.delta!r} must exceed 1 + epsilon_high = {1.0 + high!r} in grpokit "
                "(a smaller cap would also clip positive advantages; TRL recommends delta > 1 + epsilon)"
            )
        out["algo.dual_clip"] = a.delta
    return out


def objectives_fields(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    """GDPO-style normalize_then_sum: each reward normalised in its group, weighted sum, then whitened
    over the batch (TRL ignores scale_rewards there); normalize_components + batch_whiten is that."""
    if a.multi_objective_aggregation == "sum_then_normalize":
        return {"reward.normalize_components": False}
    if a.multi_objective_aggregation != "normalize_then_sum":
        raise _refuse(
            "multi_objective_aggregation", a.multi_objective_aggregation, "sum_then_normalize, normalize_then_sum"
        )
    return {"reward.normalize_components": True, "algo.scale": "batch_whiten"}


def entropy_fields(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    """TRL's entropy bonus is a plain token mean; use_adaptive_entropy moves its coefficient each
    optimizer step (grpokit/algo/entropy_control.py follows TRL's code)."""
    out = {
        "algo.entropy_coef": a.entropy_coef,
        "algo.entropy_aggregation": "token-mean",
        "algo.entropy_adaptive": a.use_adaptive_entropy,
    }
    if not a.use_adaptive_entropy:  # TRL reads the controller's settings only with it (checks.GATES)
        return out
    return out | {
        "algo.entropy_coef_min": a.entropy_coef_min,
        "algo.entropy_coef_max": a.entropy_coef_max,
        "algo.entropy_coef_delta": a.entropy_coef_delta,
        "algo.entropy_target": a.entropy_target,
    }
