"""The algo section (stages 4-5): the advantage estimator and its parameters, the objective, KL,
aggregation, masks and the variants' own fields; the GRPO family lives here."""

from __future__ import annotations

from dataclasses import field
from typing import Any, Callable, NamedTuple

from .base import section


@section
class AlgoConfig:
    advantage: str = "group"
    """The advantage estimator (stage 4), by registered name or "module:function" (docs/ALGORITHMS.md):
    "group" (GRPO's family: algo.baseline x algo.scale), "process" (DeepSeekMath process supervision, per-step
    rewards of reward.process_function), "gigpo" / "gagpo" (step-level credit across the turns of episodes:
    algo.step_gamma, algo.gigpo_step_weight, algo.gae_lambda), "gtpo" / "grpo_s" (entropy-shaped rewards,
    Tan et al., arXiv 2508.04349: algo.shaping_*, algo.gtpo_normalization), or one added with
    @grpokit.algo.register_advantage."""
    baseline: str = "group_mean"
    """Advantage baseline: "group_mean" (GRPO) or "leave_one_out" (RLOO)."""
    scale: str = "group"
    """Advantage scaling: "group" std (GRPO), "batch" std, "none" (Dr. GRPO), "token_whiten" (REINFORCE++-baseline as
    verl computes it: whitened over the batch's tokens, each completion weighted by its length) or "batch_whiten"
    (whitened over the batch's completions, each weighing one)."""
    std: str = "unbiased"
    """Std used for scaling: "unbiased" (Bessel: divides by G-1, or tokens-1 for token_whiten; as TRL and verl) or
    "population"; read by no scale=none run (nor adv_eps)."""
    adv_eps: float = 1e-4
    """Added to the std in the advantage denominator (TRL's 1e-4; verl's GRPO uses 1e-6); for scale=token_whiten added
    to the variance inside the square root, where verl puts its 1e-8."""
    clip_low: float = 0.2
    """Lower clip: the ratio is kept above 1 - clip_low."""
    clip_high: float = 0.2
    """Upper clip: the ratio is kept below 1 + clip_high (DAPO clip-higher: 0.28)."""
    dual_clip: float = 0.0
    """Dual-clip bound c > 1 for negative advantages (0 = off)."""
    ratio_level: str = "token"
    """Importance ratio per "token" (GRPO), per "sequence" (GSPO: the geometric mean of the token ratios, in the
    GSPO-token form: each token's ratio carries its own token's gradient), per "sequence_whole" (the same ratio
    with the whole sequence's gradient on every token, GSPO's sequence objective as TRL's
    importance_sampling_level="sequence"; it differs from "sequence" only where a per-token mask or weight acts:
    algo.entropy_top_fraction, rollout.tis_cap's token modes, per-token advantages), per "trajectory"
    (TIC-GRPO: their product, pi(o|q)/pi_old(o|q)) or per "turn" of an episode (GAGPO's action-level ratio)."""
    objective: str = "clip"
    """What multiplies the advantage in the loss: "clip" (PPO/GRPO clipped surrogate), "cispo" (MiniMax-M1: a REINFORCE
    term weighted by the stop-gradient IS weight truncated at 1 + clip_high; clip_low unused) "sapo" (a smooth sigmoid
    gate, no hard clip) or "vespo" (REINFORCE weighted by a stop-gradient gamma function of the trajectory ratio; needs
    ratio_level=trajectory)."""
    sapo_tau_pos: float = 1.0
    """objective=sapo: gate temperature tau for tokens with positive advantage (the paper's 1.0)."""
    sapo_tau_neg: float = 1.05
    """objective=sapo: gate temperature for tokens with negative advantage (the paper's 1.05; larger fades off-policy
    negative updates faster)."""
    vespo_pos: list[float] = field(default_factory=lambda: [2.0, 3.0])
    """objective=vespo: (k, lambda) of the gamma weight phi(w) = e^lambda w^k e^(-lambda w) where the advantage is >= 0
    (TRL's vespo_k_pos, vespo_lambda_pos)."""
    vespo_neg: list[float] = field(default_factory=lambda: [3.0, 2.0])
    """objective=vespo: (k, lambda) where the advantage is < 0 (TRL's vespo_k_neg, vespo_lambda_neg)."""
    loss_temperature: float = 0.0
    """The temperature of the trained distributions: pi_theta, pi_old, pi_ref (or a distillation teacher), their
    KL and entropies divide the logits by it (0 = rollout.temperature, the distribution that sampled). Set apart
    from rollout.temperature, only sampling changes (TRL's generation_kwargs temperature); the samples are then
    off-policy by the gap, which mismatch/* and TIS measure (rollout.tis_cap corrects it)."""
    beta: float = 0.0
    """KL penalty weight; 0 needs no reference model."""
    distill_teacher: str = ""
    """On-policy distillation (docs/DOMAINS.md): the teacher that scores the student's sampled tokens, a model
    folder (a checkpoint's model/), a named model (grpokit models) or a LoRA adapter folder; it takes the reference
    model's place, so algo.beta is then the KL to the teacher in the loss. It must share the student's tokenizer."""
    distill_coef: float = 0.0
    """With distill_teacher: weight of the per-token reward -KL(student || teacher) added to every token's advantage
    (0: none; the teacher then serves algo.beta's KL term only). With distill_top_k > 0 it weighs the forward-KL
    loss term instead (the per-token reward is then off)."""
    distill_estimator: str = "k1"
    """The per-token KL estimate of that reward on the sampled tokens: "k1" (log student - log teacher) or "k3"; read
    only by that reward (distill_coef > 0, distill_top_k=0)."""
    distill_top_k: int = 0
    """k > 0: a forward-KL loss term on the teacher's k likeliest tokens at every completion position,
    distill_coef * sum_v p_T(v) (log p_T(v) - log p_S(v)), reduced like the policy loss (algo.aggregation). p_T is
    the teacher's full-vocabulary probability, not renormalised over the k, so each term is the full forward KL's
    own and k = vocabulary size is TRL's full-vocabulary forward KL (DistillationTrainer / GKD, beta=0); the teacher's
    mass outside its top-k is logged as 1 - distill/top_k_mass. 0: off."""
    kl_estimator: str = "k3"
    """KL estimator: "k1", "k2" or "k3" (DeepSeekMath); used in the loss and, with kl_placement=reward, summed over
    tokens in the reward."""
    kl_bias_correction: bool = False
    """Multiply the per-token KL in the loss by the importance weight pi/pi_old, gradient included (DeepSeek-V3.2; TRL
    1.16's default use_bias_correction_kl=True)."""
    kl_clamp: float = 0.0
    """Clamp each token's KL estimate to [-kl_clamp, kl_clamp] (0 = off; verl clamps k3 at 10)."""
    aggregation: str = "seq-mean-token-mean"
    """Loss aggregation: seq-mean-token-mean (GRPO), token-mean (DAPO), seq-mean-token-sum-norm (Dr. GRPO),
    seq-mean-token-sum, or lambda-grpo (token-mean with learnable per-completion length weights, arXiv 2510.06870)."""
    lambda_init: float = 0.0
    """lambda-GRPO: lambda at the start of training (0 = DAPO's token-mean; > 0 favours longer completions, < 0
    shorter)."""
    lambda_lr: float = 0.01
    """lambda-GRPO: learning rate of lambda's own Adam optimizer (constant; no weight decay)."""
    lambda_r: float = 0.1111
    """lambda-GRPO: r in the lift h_i = 1 + r * z_i of the standardised length deviations z_i (1/9 keeps h > 0 for |z| <
    9)."""
    norm_constant: float = 0.0
    """Constant divisor for seq-mean-token-sum-norm (0 = rollout.max_new_tokens)."""
    num_iterations: int = 1
    """mu: optimizer updates per generated batch (old logprobs are taken once, before the first)."""
    kl_placement: str = "loss"
    """Where the beta-weighted KL goes: "loss" (GRPO) or "reward" (PPO / REINFORCE++: r -= beta * sum_t KL_k, with KL_k
    the kl_estimator on pi_old)."""
    mask_truncated: bool = False
    """DAPO overlong filtering: completions cut at max_new_tokens (and episodes cut by env.max_turns) are left out of
    the loss."""
    truncated_by: str = "finish"
    """With mask_truncated, which completions are truncated: "finish" (those cut at max_new_tokens or an episode's
    token cap, and episodes stopped by env.max_turns: finish reasons "length" and "turns") or "last_token" (TRL's
    mask_truncated_completions, which grpokit.trl sets: those whose last token is no end-of-sequence or pad id,
    whatever ended them, so an episode stopped at the turn limit on a turn that ended with EOS stays, and one that
    ends on its environment's reply does not)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts to refill."""
    max_sampling_rounds: int = 4
    """Dynamic sampling: at most this many sampling rounds per step (then train on what was collected)."""
    entropy_coef: float = 0.0
    """Entropy bonus: subtract entropy_coef * token entropy from the loss (0 = off)."""
    entropy_aggregation: str = "loss"
    """How the entropy bonus is reduced: "loss" (with the token losses, through algo.aggregation, as verl) or
    "token-mean" (a plain mean over the batch's tokens, as TRL)."""
    entropy_adaptive: bool = False
    """Skywork-OR1 adaptive entropy control (TRL's use_adaptive_entropy): entropy_coef is the starting coefficient;
    after each optimizer step it rises by entropy_coef_delta when the loss tokens' mean entropy was at or below
    entropy_target and falls by it otherwise, and the next step applies it only while that entropy is at or below the
    target (algo/entropy_control.py)."""
    entropy_target: float = 0.2
    """Adaptive entropy control: target mean token entropy in nats (TRL's default 0.2 engages only near collapse; set it
    near the entropy of the first steps)."""
    entropy_coef_delta: float = 0.005
    """Adaptive entropy control: the coefficient's change per optimizer step."""
    entropy_coef_min: float = 0.0
    """Adaptive entropy control: lowest coefficient a decrease reaches."""
    entropy_coef_max: float = 1.0
    """Adaptive entropy control: highest coefficient an increase reaches."""
    entropy_advantage: bool = False
    """EDGE-GRPO entropy-driven advantage: divide each completion's advantage by its mean token entropy over the batch's
    mean (confident answers weigh more, whether right or wrong)."""
    entropy_advantage_max_scale: float = 0.0
    """EDGE-GRPO: cap on that factor mean(P) / P_i (0 = no cap, as the paper; 10 keeps a near-deterministic completion
    from getting an unbounded advantage)."""
    error_correction: str = "off"
    """EDGE-GRPO guided error correction: in a group whose completions are all wrong, replace the last one by "gold"
    (the rendered gold answer) or "reflection" (the wrong completion, error_correction_prompt, then the gold answer),
    re-scored; "off"."""
    error_correction_fn: str = ""
    """Guided error correction: "module:function" rendering the gold answer as a completion text, called with the prompt
    and the dataset's columns (e.g. grpokit.data.tasks.arithmetic:format_completion)."""
    error_correction_prompt: str = "Wait! Something is wrong here."
    """Guided error correction, mode reflection: the cue written between the wrong attempt and the gold answer (the
    paper's)."""
    error_correction_max_reward: float = 0.0
    """Guided error correction: a group is all wrong when every completion's judged value is at most this
    (reward.judge's functions summed; with reward.judge empty, the reward as trained; 0: binary rewards)."""
    entropy_top_fraction: float = 1.0
    """Train only on this fraction of the batch's completion tokens with the highest entropy (1 = all)."""
    offpolicy_delta: float = 0.0
    """DeepSeek-V3.2 off-policy masking: drop negative-advantage sequences whose mean log(pi_old/pi) exceeds this (0 =
    off)."""
    ref_refresh_every: int = 0
    """Copy the policy into the reference model every N steps (0 = never; needs beta > 0)."""
    ref_mixup_alpha: float = 1.0
    """At each reference refresh, ref <- alpha * policy + (1 - alpha) * ref (TR-DPO's soft update; 1 = copy the
    policy)."""
    token_masks: list[str] = field(default_factory=list)
    """Extra token masks applied after mask_truncated and entropy_top_fraction, by registered name
    (@grpokit.algo.register_token_mask) or "module:function" (docs/ALGORITHMS.md)."""
    # -- the parameters of the estimators (each read only by the estimator algo.advantage names)
    # GiGPO / GAGPO (algo.advantage=gigpo or gagpo)
    step_gamma: float = 0.95
    """GiGPO / GAGPO: discount per turn of the episode's reward."""
    gigpo_step_weight: float = 1.0
    """GiGPO: weight omega of the step-level advantage added to the episode-level one."""
    gae_lambda: float = 0.95
    """GAGPO: lambda of the GAE-style sum of temporal differences."""
    # -- GTPO / GRPO-S (algo.advantage=gtpo or grpo_s)
    shaping_base_weight: float = 1.0
    """GTPO alpha1 / GRPO-S beta1: weight of the outcome reward in the shaped reward (the paper's 1.0)."""
    shaping_entropy_weight: float = 0.1
    """GTPO alpha2 / GRPO-S beta2: weight of the entropy-shaped bonus or penalty (the paper's 0.1)."""
    gtpo_normalization: str = "polarity"
    """GTPO: "polarity" normalises the batch's correct-completion tokens and wrong-completion tokens separately (the
    paper's eq. 6) or "joint" normalises all shaped tokens together (keeps the correct/wrong sign)."""

    @property
    def dynamic_sampling_on(self) -> list[str]:
        """Dynamic sampling's judge became the run's one judge, reward.judge: a config file or override still
        spells it algo.dynamic_sampling_on (config/retired.py SPELLINGS); in Python the attribute is refused."""
        raise AttributeError(JUDGE_MOVED)

    @dynamic_sampling_on.setter
    def dynamic_sampling_on(self, value: list[str]) -> None:
        raise AttributeError(JUDGE_MOVED)


JUDGE_MOVED = (
    "algo.dynamic_sampling_on is reward.judge in Python (the one judge that dynamic sampling, the frontier "
    "curriculum and EDGE-GRPO's error correction read): set cfg.reward.judge instead"
)


class Unread(NamedTuple):
    """Settings only one feature reads, and the sentence that refuses them while it is off."""

    fields: tuple[str, ...]
    """The algo fields the feature alone reads."""
    why: str
    """When nothing reads them: "unless algo.entropy_adaptive=true", "with algo.objective=sapo (...)"."""
    on: Callable[[Any], bool]
    """Whether an ``AlgoConfig`` has the feature on (the fields are read)."""
    fix: str = "set that"
    """What would make them read."""


UNREAD_UNLESS: tuple[Unread, ...] = (
    Unread(
        ("entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max"),
        "unless algo.entropy_adaptive=true",
        lambda a: a.entropy_adaptive,
    ),
    Unread(("ref_mixup_alpha",), "unless algo.ref_refresh_every > 0", lambda a: a.ref_refresh_every > 0),
    Unread(("truncated_by",), "unless algo.mask_truncated=true", lambda a: a.mask_truncated),
    Unread(
        ("lambda_init", "lambda_lr", "lambda_r"),
        "unless algo.aggregation=lambda-grpo",
        lambda a: a.aggregation == "lambda-grpo",
    ),
    Unread(
        ("max_sampling_rounds",),
        "unless algo.dynamic_sampling=true",
        lambda a: a.dynamic_sampling,
    ),
    Unread(("entropy_advantage_max_scale",), "unless algo.entropy_advantage=true", lambda a: a.entropy_advantage),
    Unread(
        ("error_correction_max_reward", "error_correction_prompt", "error_correction_fn"),
        "unless algo.error_correction is on",
        lambda a: a.error_correction != "off",
    ),
    Unread(
        ("kl_clamp", "kl_estimator", "kl_placement", "kl_bias_correction"),
        "unless algo.beta > 0 (a KL term)",
        lambda a: a.beta > 0,
    ),
    Unread(
        ("entropy_aggregation",),
        "unless algo.entropy_coef != 0 or algo.entropy_adaptive=true (an entropy bonus)",
        lambda a: a.entropy_coef != 0 or a.entropy_adaptive,
    ),
    Unread(
        ("norm_constant",),
        "unless algo.aggregation=seq-mean-token-sum-norm (Dr. GRPO's constant)",
        lambda a: a.aggregation == "seq-mean-token-sum-norm",
    ),
    Unread(  # every built-in estimator honouring scale=none leaves the std out (group, grpo_s, gigpo's step level)
        ("std", "adv_eps"),
        "with algo.scale=none (the rewards are only centred, divided by no std)",
        lambda a: a.scale != "none",
        "set algo.scale=group, batch, token_whiten or batch_whiten",
    ),
    Unread(
        ("distill_estimator",),
        "unless algo.distill_coef > 0 with algo.distill_top_k=0 (the per-token reverse-KL reward it estimates)",
        lambda a: a.distill_coef > 0 and a.distill_top_k <= 0,
    ),
)
"""Settings read only by one feature: ``Unread(fields, why, on, fix)`` over an ``AlgoConfig``. Validation refuses
such a field changed from its default while its feature is off (validation/algo.py); a preset fills it only where
its feature is on in the run it is applied to (config/presets), and the TRL layer sets it only where TRL reads it
(trl/args/loss.py), so neither a preset nor a TRL script meets these sentences. What the registered stages read is
found from their declarations instead, above this package: the clip range an objective does not read
(``ObjectiveSpec.reads_clip``: none for SAPO and VESPO, clip_low for CISPO; validation/algo.py ``objective_rules``,
joined to these rules by ``unread_rules``, which the command line hands presets so that ``--preset dapo
algo.objective=sapo`` leaves DAPO's clip range out), and the estimators' and objectives' own parameters
(``stage_owners``)."""
