"""TRL's loss arguments -> grpokit's algo and reward fields: the KL term, iterations, clipping
(epsilon, epsilon_high, delta), the ratio's level, reward scaling and weights, loss_type (with its cispo,
sapo and vespo settings), multi_objective_aggregation, truncated completions, the reference model's
sync, the entropy mask and bonus (static or adaptive) and the off-policy mask.

Each argument's mapping rule, its arithmetic and its single-value check live here together. The values
are checked against TRL's own loss code in tests/project/test_bench_loss_equality.py.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from grpokit.algo import loss as _registers_objectives  # noqa: F401  (the built-in objectives' declarations)
from grpokit.algo.registry import objective_spec
from grpokit.config.sections import ConfigError

from .batch import rounds_per
from .predicates import Gate, above, at_least, is_number
from .rule import Rule, TrlArgs, copied, refuse

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
_OBJECTIVE = {"cispo": "cispo", "sapo": "sapo", "vespo": "vespo"}  # the others: the clipped surrogate


def loss_fields(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    if a.loss_type not in _AGGREGATION:
        raise refuse("loss_type", a.loss_type, ", ".join(_AGGREGATION))
    # dr_grpo divides by max_completion_length itself, not by the sampling limit (generation_kwargs'
    # max_new_tokens may set another one); the other loss types read no constant
    constant = float(a.max_completion_length) if a.loss_type == "dr_grpo" else 0.0
    out = {"algo.aggregation": _AGGREGATION[a.loss_type], "algo.norm_constant": constant}
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


def _vespo(a: TrlArgs) -> dict[str, Any]:
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


def clip_fields(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    high = a.epsilon if a.epsilon_high is None else a.epsilon_high
    out = {"algo.clip_low": a.epsilon, "algo.clip_high": high, "algo.dual_clip": 0.0}
    # TRL's SAPO and VESPO read neither epsilon, its CISPO only epsilon_high: inert there, as the objective
    # grpokit runs for them declares (ObjectiveSpec.reads_clip), so the rest is left at grpokit's default
    reads = objective_spec(_OBJECTIVE.get(a.loss_type, "clip")).reads_clip()
    out = {k: v for k, v in out.items() if k == "algo.dual_clip" or k.removeprefix("algo.") in reads}
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


def objectives_fields(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    """GDPO-style normalize_then_sum: each reward normalised in its group, weighted sum, then whitened
    over the batch (TRL ignores scale_rewards there); normalize_components + batch_whiten is that."""
    if a.multi_objective_aggregation == "sum_then_normalize":
        return {"reward.normalize_components": False}
    if a.multi_objective_aggregation != "normalize_then_sum":
        raise refuse(
            "multi_objective_aggregation", a.multi_objective_aggregation, "sum_then_normalize, normalize_then_sum"
        )
    return {"reward.normalize_components": True, "algo.scale": "batch_whiten"}


def entropy_fields(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    """TRL's entropy bonus is a plain token mean; use_adaptive_entropy moves its coefficient each
    optimizer step (grpokit/algo/entropy_control.py follows TRL's code)."""
    out = {
        "algo.entropy_coef": a.entropy_coef,
        "algo.entropy_adaptive": a.use_adaptive_entropy,
    }
    if a.entropy_coef != 0 or a.use_adaptive_entropy:  # TRL's bonus is on: its aggregation (none to aggregate else)
        out["algo.entropy_aggregation"] = "token-mean"
    if not a.use_adaptive_entropy:  # TRL reads the controller's settings only with it (checks.GATES)
        return out
    return out | {
        "algo.entropy_coef_min": a.entropy_coef_min,
        "algo.entropy_coef_max": a.entropy_coef_max,
        "algo.entropy_coef_delta": a.entropy_coef_delta,
        "algo.entropy_target": a.entropy_target,
    }


def _scale(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    if a.scale_rewards not in ("group", "batch", "none"):
        raise refuse("scale_rewards", a.scale_rewards, "group (True), batch, none (False)")
    return {"algo.scale": a.scale_rewards}


def _ref_sync(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    if not a.sync_ref_model:
        return {"algo.ref_refresh_every": 0}
    every = rounds_per(a.ref_model_sync_steps, a, ctx["world_size"])  # TRL counts optimizer steps, grpokit rounds
    return {"algo.ref_refresh_every": every, "algo.ref_mixup_alpha": a.ref_model_mixup_alpha}


def offpolicy_delta(threshold: float | None) -> float:
    """grpokit's ``algo.offpolicy_delta`` for TRL's off_policy_mask_threshold. grpokit reads 0 as "off", TRL
    as an active threshold (a sequence is dropped when its mean log-ratio is > 0): TRL's 0 becomes the smallest
    positive float, 5e-324, as no float32 or bfloat16 log-ratio lies in (0, 5e-324] (and a float64 one only at
    5e-324 itself), so ``drift > 5e-324`` drops exactly what ``drift > 0`` drops; None is off."""
    if threshold is None:
        return 0.0
    return math.ulp(0.0) if threshold == 0 else float(threshold)


KL = Rule(
    ("beta", "use_bias_correction_kl"),
    ("algo.beta", "algo.kl_bias_correction"),
    "copied (use_bias_correction_kl only with beta != 0, the only time TRL reads it); KL estimator k3 as TRL",
    lambda a, ctx: {
        "algo.beta": a.beta,
        "algo.kl_estimator": "k3",
        **({"algo.kl_bias_correction": a.use_bias_correction_kl} if a.beta != 0 else {}),
    },
)

ITERATIONS = Rule(
    ("num_iterations",), ("algo.num_iterations",), "copied", copied(**{"algo.num_iterations": "num_iterations"})
)

CLIPPING = Rule(
    ("epsilon", "epsilon_high", "delta"),
    ("algo.clip_low", "algo.clip_high", "algo.dual_clip"),
    "epsilon_high None: epsilon; delta (two-sided clipping, capping the ratio where A < 0) is dual_clip, "
    "only above 1 + epsilon_high (below it TRL's cap also clips A > 0); with loss_type sapo or vespo neither "
    "epsilon is read, with cispo epsilon is not (inert, as in TRL)",
    clip_fields,
)

# TRL's importance_sampling_level -> algo.ratio_level: TRL's sequence ratio exp(mean log-ratio) carries the whole
# sequence's gradient to every token (GSPO's sequence objective), grpokit's "sequence" is the GSPO-token form
TRL_RATIO_LEVELS = {"token": "token", "sequence": "sequence_whole"}

RATIO_LEVEL = Rule(
    ("importance_sampling_level",),
    ("algo.ratio_level",),
    "token, or sequence (GSPO) as sequence_whole: the sequence ratio with its whole gradient on every token, as "
    "TRL (grpokit's own sequence level is the GSPO-token form, which differs under the entropy mask and "
    "token-level vLLM importance sampling)",
    lambda a, ctx: {"algo.ratio_level": TRL_RATIO_LEVELS[a.importance_sampling_level]},
)

REWARD_SCALING = Rule(
    ("scale_rewards",),
    ("algo.scale",),
    "group, batch, none (True: group, False: none); baseline group mean, unbiased std, eps 1e-4",
    lambda a, ctx: {**_scale(a, ctx), "algo.baseline": "group_mean", "algo.std": "unbiased", "algo.adv_eps": 1e-4},
)

LOSS_TYPE = Rule(
    (
        "loss_type",
        "max_completion_length",
        "sapo_temperature_pos",
        "sapo_temperature_neg",
        "vespo_k_pos",
        "vespo_lambda_pos",
        "vespo_k_neg",
        "vespo_lambda_neg",
    ),
    (
        "algo.aggregation",
        "algo.norm_constant",
        "algo.objective",
        "algo.sapo_tau_pos",
        "algo.sapo_tau_neg",
        "algo.ratio_level",
        "algo.vespo_pos",
        "algo.vespo_neg",
    ),
    "grpo and sapo: seq-mean-token-mean, dapo, bnpo, cispo and vespo: token-mean, dr_grpo: "
    "seq-mean-token-sum-norm with norm_constant = max_completion_length (TRL's divisor, even where "
    "generation_kwargs' max_new_tokens samples fewer tokens), "
    "luspo: seq-mean-token-sum (the clipped surrogate summed over each completion); "
    "cispo: objective cispo, clip_high = epsilon_high - 1 (TRL's epsilon_high is the weight's cap); "
    "sapo: objective sapo with the two temperatures; vespo: objective vespo at ratio_level trajectory "
    "(not with beta > 0 and use_bias_correction_kl; vLLM importance sampling in the token modes "
    "joins the weight, as TRL)",
    loss_fields,
)

OBJECTIVES = Rule(
    ("multi_objective_aggregation",),
    ("reward.normalize_components", "algo.scale"),
    "normalize_then_sum: normalize_components and scale batch_whiten (scale_rewards is then unused, as in TRL)",
    objectives_fields,
)

REWARD_WEIGHTS = Rule(
    ("reward_weights",),
    ("reward.weights",),
    "one weight per reward function, callables included",
    lambda a, ctx: {"reward.weights": list(a.reward_weights or [])},
)

MASK_TRUNCATED = Rule(
    ("mask_truncated_completions",),
    ("algo.mask_truncated", "algo.truncated_by"),
    "copied; truncated_by last_token: TRL's rule, a completion whose last token is no EOS or pad id (an episode "
    "stopped at max_tool_calling_iterations on a turn that ended with EOS stays)",
    lambda a, ctx: {
        "algo.mask_truncated": a.mask_truncated_completions,
        **({"algo.truncated_by": "last_token"} if a.mask_truncated_completions else {}),
    },
)

REF_SYNC = Rule(
    ("sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps"),
    ("algo.ref_refresh_every", "algo.ref_mixup_alpha"),
    "every ref_model_sync_steps TRL steps (in grpokit steps: divided by the updates per round, at "
    "least 1), ref <- alpha * policy + (1 - alpha) * ref (alpha 1: a copy)",
    _ref_sync,
)

ENTROPY_MASK = Rule(
    ("top_entropy_quantile",),
    ("algo.entropy_top_fraction",),
    "copied; above 1 is 1 (every token: TRL masks only below 1)",
    lambda a, ctx: {"algo.entropy_top_fraction": min(a.top_entropy_quantile, 1.0)},
)

ENTROPY_BONUS = Rule(
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
    "entropy_aggregation token-mean, as TRL (with a bonus: entropy_coef != 0 or use_adaptive_entropy); "
    "use_adaptive_entropy is entropy_adaptive (TRL's code: the coefficient "
    "rises when the entropy is at or below the target, and the first step applies none)",
    entropy_fields,
)

OFF_POLICY_MASK = Rule(
    ("off_policy_mask_threshold",),
    ("algo.offpolicy_delta",),
    "None: 0 (off); TRL's 0 is a threshold (negative-advantage completions whose mean log-ratio is above 0 "
    "leave the loss): the smallest positive float (no log-ratio lies between it and 0)",
    lambda a, ctx: {"algo.offpolicy_delta": offpolicy_delta(a.off_policy_mask_threshold)},
)


_VESPO = Gate(("loss_type",), lambda a: a.loss_type == "vespo")
_REF_SYNC = Gate(("sync_ref_model",), lambda a: a.sync_ref_model)
_ADAPTIVE = Gate(("use_adaptive_entropy",), lambda a: a.use_adaptive_entropy)

CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {  # single-value checks (checks.py runs them)
    "beta": (
        at_least(0),
        "a finite number >= 0 (TRL runs a negative beta too, rewarding divergence from the reference)",
    ),
    "num_iterations": (at_least(1, integer=True), "an integer >= 1"),
    "epsilon": (at_least(0), "a finite number >= 0 (TRL runs a negative one too, with an empty clipping range)"),
    "epsilon_high": (
        at_least(0, none=True),
        "None or a finite number >= 0 (TRL runs a negative one too, clipping every ratio below 1)",
    ),
    "delta": (
        above(1, none=True),
        "None or a finite number > 1 (TRL runs a delta <= 1 too, but it caps the on-policy ratio 1: no gradient)",
    ),
    "importance_sampling_level": (lambda x: x in ("token", "sequence"), "'token' or 'sequence'"),
    "reward_weights": (
        lambda x: x is None or (isinstance(x, (list, tuple)) and all(is_number(w) for w in x)),
        "None or a list of finite numbers, one per reward function",
    ),
    "ref_model_sync_steps": (at_least(1, integer=True), "an integer >= 1"),
    "ref_model_mixup_alpha": (lambda x: is_number(x) and 0 < x <= 1, "a number in (0, 1]"),
    "vespo_k_pos": (at_least(0), "a finite number >= 0"),
    "vespo_k_neg": (at_least(0), "a finite number >= 0"),
    "vespo_lambda_pos": (above(0), "a finite number > 0"),
    "vespo_lambda_neg": (above(0), "a finite number > 0"),
    "top_entropy_quantile": (
        above(0),
        "a number > 0 (1 or above: every token, as TRL; TRL runs 0 too, training only on the batch's single "
        "highest-entropy token)",
    ),
    "entropy_coef": (is_number, "a finite number (negative: an entropy penalty, as TRL's loss - entropy_coef * H)"),
    "entropy_coef_min": (at_least(0), "a finite number >= 0"),
    "entropy_coef_max": (at_least(0), "a finite number >= 0"),
    "entropy_coef_delta": (at_least(0), "a finite number >= 0"),
    "entropy_target": (at_least(0), "a finite number >= 0 (nats)"),
    "off_policy_mask_threshold": (
        at_least(0, none=True),
        "None or a finite number >= 0 (TRL runs a negative one too: it drops every negative-advantage completion "
        "whose mean log-ratio exceeds it, on-policy all of them, as that ratio is 0 there)",
    ),
}

GATES: dict[str, Gate] = {  # fields TRL reads only while another argument is on (checks.py)
    "vespo_k_pos": _VESPO,
    "vespo_lambda_pos": _VESPO,
    "vespo_k_neg": _VESPO,
    "vespo_lambda_neg": _VESPO,
    "ref_model_mixup_alpha": _REF_SYNC,
    "ref_model_sync_steps": _REF_SYNC,
    "entropy_coef_min": _ADAPTIVE,
    "entropy_coef_max": _ADAPTIVE,
    "entropy_coef_delta": _ADAPTIVE,
    "entropy_target": _ADAPTIVE,
}
