"""The GRPO family as named sets of config overrides on the one trainer.

Each entry is what a user would type on the command line to select the variant on top of any
run (``grpokit train algo.scale=none ...``). ``scripts/compare_variants.py`` trains each on the
built-in task and writes docs/VARIANT_COMPARISON.md; tests/project/test_variants_e2e.py runs each for a
few steps. Presets (published hyperparameters at full scale) live in grpokit/config/presets/.
"""

from __future__ import annotations

VARIANTS: dict[str, tuple[str, list[str]]] = {
    "grpo": ("GRPO, outcome supervision (DeepSeekMath)", []),
    "grpo-process": (
        "GRPO, process supervision: per-step rewards (DeepSeekMath PS)",
        ["algo.advantage=process", "reward.process_function=task"],
    ),
    "dr-grpo": (
        "Dr. GRPO: no std scaling, token sums / constant",
        ["algo.scale=none", "algo.aggregation=seq-mean-token-sum-norm"],
    ),
    "dapo": (  # verl's DAPO recipe: soft overlong punishment, no overlong filtering (algo.mask_truncated)
        "DAPO: clip-higher, token-mean, soft overlong punishment, dynamic sampling",
        [
            "algo.clip_high=0.28",
            "algo.aggregation=token-mean",
            "algo.dynamic_sampling=true",
            "reward.judge=[task]",  # DAPO: some but not all correct, the overlong penalty aside
            "reward.functions=[task, overlong_penalty]",
            "reward.params={overlong_penalty: {max_length: 8, cache_length: 2}}",
        ],
    ),
    "gspo": (
        "GSPO: sequence-level ratio and clipping",
        ["algo.ratio_level=sequence", "algo.clip_low=0.0003", "algo.clip_high=0.0004", "algo.num_iterations=2"],
    ),
    "rloo": ("RLOO: leave-one-out baseline", ["algo.baseline=leave_one_out", "algo.scale=none"]),
    "reinforce-pp": (
        "REINFORCE++-baseline: group mean, token-weighted batch whitening (as verl)",
        ["algo.scale=token_whiten"],
    ),
    "gfpo": ("GFPO: sample 2G, keep the G shortest", ["rollout.sample_group_size=16", "rollout.gfpo_criterion=length"]),
    "gfpo-adaptive": (
        "GFPO adaptive: extra samples for hard prompts only, keep by reward per token",
        ["rollout.sample_group_size=16", "rollout.gfpo_adaptive=true", "rollout.gfpo_criterion=token_efficiency"],
    ),
    "mo-grpo": (
        "Multi-objective: each reward normalised within its group before the weighted sum",
        [
            "reward.functions=[task, 'grpokit.data.tasks.arithmetic_steps:digit_accuracy']",
            "reward.weights=[1.0, 0.5]",
            "reward.normalize_components=true",
        ],
    ),
    "entropy-bonus": ("Entropy bonus in the loss", ["algo.entropy_coef=0.002"]),
    "high-entropy-tokens": ("Train on the 20% highest-entropy tokens only", ["algo.entropy_top_fraction=0.2"]),
    "offpolicy-mask": (
        "Off-policy sequence masking (DeepSeek-V3.2) with 2 updates per batch",
        ["algo.num_iterations=2", "algo.offpolicy_delta=0.001"],
    ),
    "ref-refresh": ("KL to a reference refreshed every 10 steps", ["algo.beta=0.04", "algo.ref_refresh_every=10"]),
    "cispo": (
        "CISPO (MiniMax-M1): REINFORCE weighted by the stop-gradient IS weight capped at 5, token-mean; 2 updates "
        "per batch",
        ["algo.objective=cispo", "algo.clip_high=4.0", "algo.aggregation=token-mean", "algo.num_iterations=2"],
    ),
    "sapo": (
        "SAPO: soft sigmoid gate (tau 1.0 / 1.05) instead of the hard clip; 2 updates per batch",
        ["algo.objective=sapo", "algo.num_iterations=2"],
    ),
    "tic-grpo": (
        "TIC-GRPO: one clipped trajectory-level ratio (the product of the token ratios); 2 updates per batch",
        ["algo.ratio_level=trajectory", "algo.num_iterations=2"],
    ),
    "2-grpo": (
        "2-GRPO (It Takes Two): pairs, G=2, with 4x the prompts for the same 128 completions a step",
        ["rollout.group_size=2", "train.prompts_per_step=64"],
    ),
    "edge-grpo-eda": (
        "EDGE-GRPO's entropy-driven advantage: A_i divided by its completion's entropy over the batch mean",
        ["algo.entropy_advantage=true"],
    ),
    "edge-grpo": (
        "EDGE-GRPO: entropy-driven advantage plus guided error correction (all-wrong groups get the gold answer as "
        "a member)",
        [
            "algo.entropy_advantage=true",
            "algo.error_correction=gold",
            "algo.error_correction_fn=grpokit.data.tasks.arithmetic:format_completion",
            "reward.judge=[task]",  # EDGE-GRPO: a group is all wrong by its verifier, whatever else the reward holds
        ],
    ),
    "gtpo": (
        "GTPO: per-token rewards shaped by entropy (bonus shares in correct answers, inverse-entropy penalty shares "
        "in wrong ones), eq. 6 normalisation, token-mean",
        ["algo.advantage=gtpo", "algo.aggregation=token-mean"],
    ),
    "gtpo-joint": (
        "GTPO with all shaped token rewards normalised together (keeps the correct/wrong sign), token-mean",
        ["algo.advantage=gtpo", "algo.gtpo_normalization=joint", "algo.aggregation=token-mean"],
    ),
    "grpo-s": (
        "GRPO-S: per-completion rewards shaped by mean token entropy, normalised within the group",
        ["algo.advantage=grpo_s"],
    ),
    "lambda-grpo": (
        "lambda-GRPO: token-mean with learnable per-completion length weights G softmax((1 + r z)^lambda), lambda "
        "trained (lr 0.01)",
        ["algo.aggregation=lambda-grpo"],
    ),
    "kl-in-reward": (
        "KL subtracted from the reward instead of added to the loss",
        ["algo.beta=0.04", "algo.kl_placement=reward", "algo.kl_estimator=k1"],
    ),
}
