"""Stage 5b: the policy loss, as pure tensor functions.

Shapes: N sequences (completions), T completion tokens; ``mask_NT`` is 1 on real completion tokens.
The loss of token t of sequence i is

    l[i,t] = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)   (PPO clipped surrogate)
             (optionally bounded below by -dual_clip * A when A < 0: dual-clip PPO, Ye et al. 2020)
             + beta * KL_k[i,t]                                          (GRPO: KL in the loss)
               (optionally times the importance weight pi_theta / pi_old: DeepSeek-V3.2, TRL's default)

where ``rho`` is the importance ratio pi_theta / pi_old, per token (GRPO), per sequence (GSPO: a
geometric mean) or per trajectory (TIC-GRPO: the product; all in ratio.py), and ``A`` is the advantage,
per sequence ``(N,)`` or per token ``(N, T)`` (process supervision).
The token losses are then reduced by one of the named ``AGGREGATIONS``. Other registered objectives
replace the clipped surrogate (same ratio, KL, entropy and aggregation around them), each one file
that registers its function with an ``ObjectiveSpec`` (registry.py) declaring its parameters:

    cispo: l[i,t] = -sg(min(rho, 1 + clip_high)) * A * log pi_theta      (MiniMax-M1, cispo.py)
    sapo:  l[i,t] = -sigmoid(tau * (rho - 1)) * 4 / tau * A,  tau = tau_pos if A > 0 else tau_neg  (sapo.py)
    vespo: l[i,t] = -sg(phi(w_i)) * A * log pi_theta, phi a gamma-shaped weight of the trajectory ratio (vespo.py)

Normalisers are arguments. Gradient accumulation splits a batch into micro-batches and sums their
losses; that equals the whole batch's loss only when every micro-batch divides by the *whole
batch's* token count / sequence count. So callers pass ``num_sequences`` and ``num_tokens`` of the
whole batch, and the reduction is a plain sum divided by them.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from .contexts import WEIGHT
from .masks import offpolicy_sequences
from .ratio import kl_weight, log_importance_ratio, unit_fractions
from .registry import ObjectiveSpec, lookup, objective_spec, register_objective, registered
from .settings import ClipSettings, EntropyBonus, KLSettings, LossSettings, LossTensors, Normalisers

Aggregation = Literal[
    "seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum", "lambda-grpo"
]
AGGREGATIONS: tuple[str, ...] = (
    "seq-mean-token-mean",
    "token-mean",
    "seq-mean-token-sum-norm",
    "seq-mean-token-sum",
    "lambda-grpo",
)
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
ENTROPY_AGGREGATIONS: tuple[str, ...] = ("loss", "token-mean")


def kl_estimate(
    logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor, estimator: str = "k3", clamp: float | None = None
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta (Schulman 2020).

    With ``d = ref_logp - logp`` (log of pi_ref / pi_theta):
      * k1 = -d                       (unbiased, high variance, can be negative)
      * k2 = d^2 / 2                  (biased, low variance)
      * k3 = exp(d) - d - 1           (unbiased, low variance, always >= 0; DeepSeekMath's choice)

    ``clamp``: bound the estimate to ``[-clamp, clamp]`` (no gradient where it binds). verl clamps
    k3 at 10; its extra clamp of ``d`` to [-20, 20] never changes a k3 clamped at 19 or less, since
    ``|d| > 20`` already gives k3 > 19.
    """
    d = ref_logp_NT - logp_NT
    if estimator == "k1":
        kl = -d
    elif estimator == "k2":
        kl = 0.5 * d * d
    elif estimator == "k3":
        kl = torch.exp(d) - d - 1.0  # DeepSeekMath eq. (4)
    else:
        raise ValueError(f"unknown kl_estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
    if clamp is not None:
        if clamp <= 0:
            raise ValueError(f"kl clamp must be > 0 (or None for no clamp), got {clamp}")
        kl = kl.clamp(-clamp, clamp)  # verl: k3 clamped at 10 for numerical stability
    return kl


def aggregate(
    loss_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    mode: Aggregation,
    *,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    norm_constant: float | None = None,
    seq_weights_N: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to a scalar.

    * ``"seq-mean-token-mean"`` (GRPO, DeepSeekMath): ``1/N sum_i 1/|o_i| sum_t l[i,t]``
    * ``"token-mean"`` (DAPO): ``1/sum_i|o_i| sum_i sum_t l[i,t]``, every token weighs the same
    * ``"seq-mean-token-sum-norm"`` (Dr. GRPO): ``1/(N * C) sum_i sum_t l[i,t]`` with a fixed C
      such as the maximum completion length, so no length-dependent weighting
    * ``"seq-mean-token-sum"``: ``1/N sum_i sum_t l[i,t]``
    * ``"lambda-grpo"`` (arXiv 2510.06870): ``1/sum_i|o_i| sum_i f_i sum_t l[i,t]`` with per-sequence
      weights ``seq_weights_N`` = ``f`` (``lambda_weights``; carrying the gradient to lambda). With
      ``f = 1`` it is ``"token-mean"``; with ``f_i = sum_j|o_j| / (N |o_i|)`` it is ``"seq-mean-token-mean"``.

    ``num_sequences`` (N) and ``num_tokens`` (sum of |o_i|) default to this batch's own counts;
    pass the whole batch's counts when this is one micro-batch of it.
    """
    mask = mask_NT.to(loss_NT.dtype)
    n_seq = float(mask_NT.shape[0]) if num_sequences is None else float(num_sequences)
    n_tok = float(mask.sum().clamp(min=1).item()) if num_tokens is None else float(num_tokens)
    masked_NT = loss_NT * mask
    if mode == "seq-mean-token-mean":
        per_seq_N = masked_NT.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_seq_N.sum() / n_seq
    if mode == "token-mean":
        return masked_NT.sum() / max(n_tok, 1.0)  # DAPO: token-level loss
    if mode == "seq-mean-token-sum-norm":
        if norm_constant is None or norm_constant <= 0:
            raise ValueError(
                "aggregation 'seq-mean-token-sum-norm' needs a positive norm_constant (e.g. max completion length)"
            )
        return masked_NT.sum() / (n_seq * norm_constant)  # Dr. GRPO: divide by a constant
    if mode == "seq-mean-token-sum":
        return masked_NT.sum() / n_seq
    if mode == "lambda-grpo":
        if seq_weights_N is None:
            raise ValueError("aggregation 'lambda-grpo' needs seq_weights_N, the per-sequence weights f_lambda (N,)")
        return (masked_NT.sum(dim=1) * seq_weights_N.to(masked_NT.dtype)).sum() / max(
            n_tok, 1.0
        )  # lambda-GRPO: f_i weighs o_i's tokens
    raise ValueError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")


def lambda_weights(
    lengths_N: torch.Tensor,
    group_size: int,
    lam: torch.Tensor | float,
    *,
    r: float = 1 / 9,
    floor: float = 1e-6,
    eps: float = 1e-8,
) -> torch.Tensor:
    """lambda-GRPO's per-completion weights ``f_lambda`` (Wang et al., arXiv 2510.06870), ``(N,)``.

    Within each group of G completions (rows grouped consecutively) with lengths ``|o_i|``:

        z_i = (|o_i| - mean_g |o|) / (std_g |o| + eps)     standardised length deviation (population std)
        h_i = max(1 + r z_i, floor)                         lifted to be positive
        f_i = G * softmax_i(h_i ** lambda)                  token-group weights, mean 1 over the group

    ``lambda = 0`` gives ``f = 1`` (DAPO's token-mean) whatever the lengths; ``lambda > 0`` moves
    weight to longer completions, ``lambda < 0`` to shorter ones (GRPO's ``1/|o_i|`` direction).
    Equal lengths give ``f = 1`` for any lambda. ``lam`` may be a tensor with gradient: the weights
    carry it. The floor is ours: the paper's lift ``1 + r z`` is positive only while ``r |z| < 1``
    (``r = 1/9`` keeps it so for |z| < 9), and ``h ** lambda`` needs ``h > 0``.
    """
    L = lengths_N.to(torch.float32).view(-1, group_size)
    z = (L - L.mean(dim=1, keepdim=True)) / (L.std(dim=1, keepdim=True, correction=0) + eps)
    h = (1.0 + r * z).clamp(min=floor)  # lambda-GRPO: lifted deviations h_i = 1 + r z_i
    lam_t = lam if isinstance(lam, torch.Tensor) else torch.tensor(float(lam))
    g = torch.pow(h, lam_t.to(h.device, h.dtype))  # lambda-GRPO: g_i = h_i ** lambda, learnable lambda
    return (group_size * torch.softmax(g, dim=1)).flatten()  # lambda-GRPO: f_i = G softmax(g)_i


# the keyword names policy_loss has always taken -> (record, field) of LossSettings / Normalisers / LossTensors
_KEYWORDS: dict[str, tuple[str, str]] = {
    **{k: ("clip", k) for k in ("clip_low", "clip_high", "dual_clip", "ratio_level", "objective")},
    "beta": ("kl", "beta"),
    "kl_estimator": ("kl", "estimator"),
    "kl_bias_correction": ("kl", "bias_correction"),
    "kl_clamp": ("kl", "clamp"),
    "entropy_coef": ("entropy", "coef"),
    "entropy_aggregation": ("entropy", "aggregation"),
    "offpolicy_delta": ("top", "offpolicy_delta"),
    **{k: ("norms", k) for k in ("aggregation", "num_sequences", "num_tokens", "norm_constant")},
    "ref_logp_NT": ("tensors", "ref_logp"),
    "entropy_NT": ("tensors", "entropy"),
    "turn_ids_NT": ("tensors", "turn_ids"),
    "seq_weights_N": ("tensors", "seq_weights"),
    "sampler_log_weight_N": ("tensors", "sampler_log_weight"),
    "policy_mask_NT": ("tensors", "policy_mask"),
    "policy_weight_NT": ("tensors", "policy_weight"),
}


def policy_loss(
    logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, advantages: torch.Tensor, mask_NT: torch.Tensor, **options
) -> tuple[torch.Tensor, dict[str, float]]:
    """``objective_loss`` with its settings given as keywords (the names in ``_KEYWORDS``: ``clip_low``,
    ``beta``, ``aggregation``, ``ref_logp_NT`` ...) and the objectives' own parameters (``sapo_tau_pos``,
    ``vespo_pos`` ...: the fields of their ``ObjectiveSpec.params``), for tests and one-off calls; the
    trainer builds the records once (algo/pipeline.py). An unknown keyword is a TypeError, as for any function."""
    parts: dict[str, dict] = {"clip": {}, "kl": {}, "entropy": {}, "top": {}, "norms": {}, "tensors": {}, "params": {}}
    own = _param_fields()
    for key, value in options.items():
        if key not in _KEYWORDS and key not in own:
            raise TypeError(
                f"policy_loss() got an unexpected keyword argument {key!r}; valid: {', '.join([*_KEYWORDS, *own])}"
            )
        record, name = _KEYWORDS[key] if key in _KEYWORDS else ("params", key)
        parts[record][name] = value
    params_cls = objective_spec(parts["clip"].get("objective", "clip")).params
    mine = {k: v for k, v in parts["params"].items() if params_cls is not None and k in _fields(params_cls)}
    clip = ClipSettings(**parts["clip"], params=params_cls(**mine) if params_cls is not None else None)
    settings = LossSettings(clip, KLSettings(**parts["kl"]), EntropyBonus(**parts["entropy"]), **parts["top"])
    tensors = LossTensors(logp_NT, old_logp_NT, advantages, mask_NT, **parts["tensors"])
    return objective_loss(tensors, settings, Normalisers(**parts["norms"]))


def _fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _param_fields() -> list[str]:
    """The parameter names of every registered objective that declares some."""
    return [
        n
        for name in registered("objective")
        if objective_spec(name).params is not None
        for n in _fields(objective_spec(name).params)
    ]


def objective_loss(t: LossTensors, s: LossSettings, norms: Normalisers) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss of one (micro-)batch: surrogate of the importance ratio times the advantage,
    plus the KL penalty and minus the entropy bonus, reduced by ``norms``.

    ``t.logp`` carries the gradient; ``t.old_logp`` is pi_old (equal to ``t.logp`` numerically
    on-policy, where the loss is REINFORCE with baseline: ``-A * logp`` in gradient). ``t.advantages``
    is ``(N,)`` per sequence or ``(N, T)`` per token. ``t.mask`` is every token that counts (the KL term,
    the normalisers, the metrics); the policy term (surrogate and entropy bonus) counts only on
    ``t.policy_mask`` (the entropy top-fraction's tokens) when given, and the surrogate is weighed by
    ``t.policy_weight`` (TIS, IcePop / MIS) when given. The off-policy mask
    (``s.offpolicy_delta``, DeepSeek-V3.2) drops the policy term of negative-advantage sequences that
    drifted more than delta in mean log-ratio; their KL term and their place in the normalisers stay.

    Returns ``(loss, metrics)``; metrics are masked token means over this batch: ``clip_ratio/low_mean``,
    ``clip_ratio/high_mean``, ``clip_ratio/region_mean``, ``clip_ratio/dual_mean``, ``ratio/mean``,
    ``num_tokens``, ``offpolicy/masked_sequences``, ``kl`` (when beta != 0) and, when the entropy bonus
    is on (or adaptive), ``entropy/bonus``: the amount subtracted from this batch's loss.
    """
    _check(s)
    c = s.clip
    adv_NT = (t.advantages[:, None].expand_as(t.logp) if t.advantages.dim() == 1 else t.advantages).to(t.logp.dtype)
    grad_NT, policy_NT, n_offpolicy = _policy_masks(t, s, adv_NT)
    # a sequence's (turn's) ratio is the likelihood ratio of all its tokens (GSPO's 1/|o_i|), even where a
    # token mask (entropy top-fraction) keeps only some of them in the gradient
    span_NT = t.ratio_mask if t.ratio_mask is not None else t.mask
    log_ratio_NT = log_importance_ratio(t.logp, t.old_logp, span_NT, c.ratio_level, t.turn_ids)
    ratio_NT = torch.exp(log_ratio_NT)
    # an objective that declares a sampler weight (VESPO, as TRL) takes pi_old / pi_sampler inside its ratio
    obj_ratio_NT = ratio_NT if t.sampler_log_weight is None else torch.exp(log_ratio_NT + t.sampler_log_weight[:, None])
    loss_NT = -lookup("objective", c.objective)(obj_ratio_NT, adv_NT, t.logp, c) * policy_NT
    kl_NT = _kl_term(t, s)
    if kl_NT is not None:
        loss_NT = loss_NT + s.kl.beta * kl_NT  # GRPO: KL in the loss, not in the reward; on every token of t.mask
    bonus_NT = _entropy_term(t, s.entropy)
    if bonus_NT is not None:  # the bonus acts on the policy term's tokens (TRL's effective mask)
        bonus_NT = bonus_NT * grad_NT
    if bonus_NT is not None and s.entropy.aggregation == "loss":
        loss_NT = loss_NT - bonus_NT
    loss, bonus = _reduce(loss_NT, t.mask, norms, t.seq_weights), 0.0
    if bonus_NT is not None and s.entropy.aggregation == "token-mean":  # TRL: a plain token mean
        bonus_term = aggregate(bonus_NT, grad_NT, "token-mean", num_tokens=_policy_tokens(t, norms))
        loss, bonus = loss - bonus_term, float(bonus_term.detach())
    elif bonus_NT is not None:  # the bonus inside the reduction: its share, for the policy_loss metric
        with torch.no_grad():
            bonus = float(_reduce(bonus_NT.detach(), t.mask, norms, t.seq_weights))
    metrics = clip_metrics(ratio_NT, adv_NT, t.mask, c)
    if bonus_NT is not None or s.entropy.adaptive:
        metrics["entropy/bonus"] = bonus  # subtracted from the loss; loss + bonus is TRL's policy_loss
    metrics["offpolicy/masked_sequences"] = n_offpolicy
    own_metrics = objective_spec(c.objective).metrics
    if own_metrics is not None:
        metrics |= own_metrics(obj_ratio_NT, adv_NT, c)
    if kl_NT is not None:
        with torch.no_grad():
            m = t.mask.bool()
            metrics["kl"] = (kl_NT[m].sum() / m.sum().clamp(min=1).float()).item()
    return loss, metrics


def _reduce(x_NT: torch.Tensor, m_NT: torch.Tensor, norms: Normalisers, seq_weights_N: torch.Tensor | None):
    """``aggregate`` by ``norms`` (the whole batch's counts)."""
    counts = dict(num_sequences=norms.num_sequences, num_tokens=norms.num_tokens, norm_constant=norms.norm_constant)
    return aggregate(x_NT, m_NT, norms.aggregation, seq_weights_N=seq_weights_N, **counts)


def _policy_masks(t: LossTensors, s: LossSettings, adv_NT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(bonus mask, surrogate's factor, sequences dropped)``: the tokens of the policy term. A policy-only token
    mask (entropy top-fraction) narrows both, the off-policy mask the surrogate's only, and the sampler
    corrections' ``t.policy_weight`` (TIS, IcePop / MIS) weighs the surrogate's tokens (TRL: the per-token loss
    times the importance sampling ratio); the KL term, the normalisers and the metrics keep every token of
    ``t.mask`` (the papers' objectives, TRL's code)."""
    grad_NT = (t.mask if t.policy_mask is None else t.policy_mask).to(t.logp.dtype)
    weighted_NT = grad_NT if t.policy_weight is None else grad_NT * t.policy_weight.to(grad_NT)
    if s.offpolicy_delta is None:
        return grad_NT, weighted_NT, 0.0
    drop_N = offpolicy_sequences(t.logp.detach(), t.old_logp, adv_NT, t.mask, s.offpolicy_delta)
    policy_NT = weighted_NT * (~drop_N)[:, None].to(grad_NT.dtype)  # DeepSeek-V3.2: off-policy sequence masking
    return grad_NT, policy_NT, float(drop_N.sum())


def _policy_tokens(t: LossTensors, norms: Normalisers) -> float | None:
    """What the token-mean entropy bonus divides by: the whole batch's policy-mask tokens when given; the loss
    tokens when no policy mask narrows the loss mask; else None (this batch's own policy-mask tokens)."""
    if norms.num_policy_tokens is not None:
        return norms.num_policy_tokens
    return norms.num_tokens if t.policy_mask is None else None


def _check(s: LossSettings) -> None:
    c = s.clip
    if not (0.0 <= c.clip_low < 1.0):
        raise ValueError(f"clip_low must be in [0, 1), got {c.clip_low}")
    lowest = objective_spec(c.objective).min_clip_high  # CISPO's weight cap 1 + clip_high may be below 1
    if c.clip_high < lowest:
        raise ValueError(f"clip_high must be >= {lowest:g} with objective {c.objective}, got {c.clip_high}")
    if c.dual_clip is not None and c.dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {c.dual_clip}")
    if s.entropy.aggregation not in ENTROPY_AGGREGATIONS:
        raise ValueError(
            f"unknown entropy_aggregation {s.entropy.aggregation!r}; valid: {', '.join(ENTROPY_AGGREGATIONS)}"
        )


def _kl_term(t: LossTensors, s: LossSettings) -> torch.Tensor | None:
    """Per-token KL to the reference ``(N, T)``, or None when beta is 0."""
    if s.kl.beta == 0.0:
        return None
    if t.ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp_NT (reference-policy logprobs)")
    kl_NT = kl_estimate(t.logp, t.ref_logp, s.kl.estimator, clamp=s.kl.clamp)
    if s.kl.bias_correction:  # DeepSeek-V3.2: unbiased KL gradient from samples of pi_old
        kl_NT = kl_NT * kl_weight(
            t.logp, t.old_logp, t.ratio_mask if t.ratio_mask is not None else t.mask, s.clip.ratio_level
        )
    return kl_NT


def _entropy_term(t: LossTensors, e: EntropyBonus) -> torch.Tensor | None:
    """``coef * H`` per token (rewards keeping the policy spread), or None when coef is 0."""
    if e.coef == 0.0:
        return None
    if t.entropy is None:
        raise ValueError("entropy_coef != 0 needs entropy_NT")
    return e.coef * t.entropy


@torch.no_grad()
def clip_metrics(
    ratio_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, c: ClipSettings
) -> dict[str, float]:
    """The share of the ratios the objective clipped (low / high / either / dual, and the objective's own
    flags, e.g. CISPO's ``cispo_clip_ratio``) over the ratio level's units (``ratio.unit_fractions``: the
    masked tokens, or at a sequence-wide level the sequences, as TRL counts them); ``clip_ratio/low_min`` and
    ``/high_max``, the lowest / highest share of one sequence (TRL's); the mean ratio over the masked tokens
    and the token count. ``weight/<name>``: the units a share is over (update.py weighs micro-batches by it)."""
    m = mask_NT.bool()
    low, high, extra = (objective_spec(c.objective).clipped or ppo_clipped)(ratio_NT, adv_NT, mask_NT, c)
    dual = (ratio_NT > c.dual_clip) & (adv_NT < 0) & m if c.dual_clip is not None else torch.zeros_like(m)
    flags = {
        **extra,
        "clip_ratio/low_mean": low,
        "clip_ratio/high_mean": high,
        "clip_ratio/region_mean": low | high,
        "clip_ratio/dual_mean": dual,
    }
    out: dict[str, float] = {}
    for name, flag in flags.items():
        if not isinstance(flag, torch.Tensor):  # a plugin's own metric, already a number
            out[name] = float(flag)
            continue
        out[name], fractions_N, units = unit_fractions(flag, mask_NT, c.ratio_level)
        out[WEIGHT + name] = units
        if name in ("clip_ratio/low_mean", "clip_ratio/high_mean"):  # TRL: nanmin / nanmax over the sequences
            out[name.replace("_mean", "_min" if "low" in name else "_max")] = _nan_extreme(fractions_N, "low" in name)
    n = m.sum().clamp(min=1).float()
    return {**out, "ratio/mean": (ratio_NT[m].sum() / n).item(), "num_tokens": float(m.sum().item())}


def _nan_extreme(x_N: torch.Tensor, lowest: bool) -> float:
    """The min (``lowest``) or max of the non-NaN entries; NaN when there are none (TRL's nanmin / nanmax)."""
    x = x_N[~torch.isnan(x_N)]
    if x.numel() == 0:
        return float("nan")
    return float(x.min() if lowest else x.max())


@torch.no_grad()
def ppo_clipped(ratio_NT: torch.Tensor, adv_NT: torch.Tensor, mask_NT: torch.Tensor, c: ClipSettings):
    """``(low, high, extra metrics)`` of PPO's clip: the tokens whose ratio left ``[1 - clip_low, 1 + clip_high]``
    on the side where the clip binds."""
    m = mask_NT.bool()
    return (ratio_NT < 1.0 - c.clip_low) & (adv_NT < 0) & m, (ratio_NT > 1.0 + c.clip_high) & (adv_NT > 0) & m, {}


def surrogate(
    ratio_NT: torch.Tensor, adv_NT: torch.Tensor, logp_NT: torch.Tensor, clip: ClipSettings = ClipSettings()
) -> torch.Tensor:
    """The per-token objective to maximise, ``(N, T)``; the loss is its negative. ``clip.objective``
    names a registered objective (``clip_surrogate`` below, cispo.py, sapo.py, vespo.py, or a plugin's,
    registry.py) or is ``module:function``."""
    return lookup("objective", clip.objective)(ratio_NT, adv_NT, logp_NT, clip)


def clip_config_errors(a) -> list[str]:
    """The dual clip bounds this objective only: set with another one it would be ignored."""
    if a.objective == "clip" or a.dual_clip == 0:
        return []
    return [
        f"algo.dual_clip={a.dual_clip} bounds the clipped surrogate only; set algo.dual_clip=0 with "
        f"algo.objective={a.objective}"
    ]


@register_objective("clip", ObjectiveSpec(config_errors=clip_config_errors))
def clip_surrogate(
    ratio_NT: torch.Tensor, adv_NT: torch.Tensor, logp_NT: torch.Tensor, c: ClipSettings
) -> torch.Tensor:
    """PPO / GRPO: ``min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)``, with the dual-clip bound
    ``max(., dual_clip A)`` for ``A < 0`` when ``dual_clip`` is set."""
    surr_unclipped_NT = ratio_NT * adv_NT
    surr_clipped_NT = torch.clamp(ratio_NT, 1.0 - c.clip_low, 1.0 + c.clip_high) * adv_NT  # DAPO: clip-higher
    objective_NT = torch.minimum(surr_unclipped_NT, surr_clipped_NT)
    if c.dual_clip is not None:
        # Dual-clip PPO: for A < 0 never let the objective fall below dual_clip * A.
        bounded_NT = torch.maximum(objective_NT, c.dual_clip * adv_NT)
        objective_NT = torch.where(adv_NT < 0, bounded_NT, objective_NT)
    return objective_NT


from . import cispo, sapo, vespo  # noqa: E402,F401  (each registers its objective after clip, in this order)

OBJECTIVES: tuple[str, ...] = tuple(registered("objective"))  # the built-in objectives (plugins register later)
