"""On-policy distillation (docs/DOMAINS.md): the student samples, a teacher scores the student's own
tokens, and a KL to the teacher joins the objective in one of three places.

* As a loss term: the teacher takes the reference model's place (algo.distill_teacher), so algo.beta with
  algo.kl_estimator (k1 or k3 on the sampled tokens) is ``beta * KL(pi_student || pi_teacher)`` in the
  loss, the KL term GRPO already has (algo/loss.py's kl_estimate). Nothing new runs for it.
* As a per-token reward (algo.distill_coef > 0, this file): every model token's advantage gains
  ``-coef * KL_k(t)``, with KL_k the k1 or k3 estimate at that token (algo.distill_estimator), i.e. for
  k1 ``coef * (log pi_teacher - log pi_old)``: tokens the teacher finds likelier than the student are
  pushed up (Agarwal et al. 2024, "On-Policy Distillation of Language Models"; Thinking Machines'
  per-token reverse-KL reward, with no discount). It is added after the group normalisation, so the
  GRPO part of the advantage is unchanged and the KL reward is not normalised away.

* As a forward-KL loss term on the teacher's top-k (algo.distill_top_k = k > 0, algo.distill_coef its
  weight; GKD's forward KL, Agarwal et al. 2024, restricted to the teacher's k likeliest tokens): the
  teacher's pass keeps, per completion position, its k likeliest token ids and their log-probabilities
  (train/distill_pass.py, chunked over the vocabulary like the student's head), the update's forward
  takes the student's log-probabilities of those ids, and ``coef * sum_v p_T(v) (log p_T(v) - log p_S(v))``
  joins the loss per token, reduced like the policy loss (``forward_kl_loss``).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .contexts import part_weights
from .loss import aggregate
from .registry import StageSpec, register_advantage_stage
from .settings import Normalisers

DISTILL_ESTIMATORS = ("k1", "k3")


def distill_token_rewards(
    old_logp_NT: torch.Tensor, teacher_logp_NT: torch.Tensor, mask_NT: torch.Tensor, estimator: str
) -> torch.Tensor:
    """``(N, T)`` per-token rewards ``-KL_k(pi_old || pi_teacher)`` at the sampled tokens, 0 off the mask.
    With ``d = log pi_teacher - log pi_old``: k1 = -d (reward d), k3 = exp(d) - d - 1 (reward its negative)."""
    d = teacher_logp_NT.float() - old_logp_NT.float()
    if estimator == "k1":
        kl = -d
    elif estimator == "k3":
        kl = torch.exp(d) - d - 1.0
    else:
        raise ValueError(f"unknown distill estimator {estimator!r}; valid: {', '.join(DISTILL_ESTIMATORS)}")
    return -kl * mask_NT.to(kl.dtype)


def forward_kl_top_k(teacher_logp_NTK: torch.Tensor, student_logp_NTK: torch.Tensor) -> torch.Tensor:
    """``(N, T)`` forward KL restricted to the teacher's top-k at every position:
    ``sum_{v in top-k} p_T(v) (log p_T(v) - log p_S(v))``, with ``p_T`` the teacher's full-vocabulary
    probabilities (not renormalised over the k: each term is exactly the full forward KL's term, so k = V
    is the full-vocabulary forward KL of TRL's DistillationTrainer / GKD with beta = 0). The gradient
    reaches the student only (the teacher's values are data); ``(N, T, K)`` inputs, log-probabilities."""
    t = teacher_logp_NTK.detach().to(student_logp_NTK.dtype)
    return (t.exp() * (t - student_logp_NTK)).sum(dim=-1)


@dataclasses.dataclass(frozen=True)
class TeacherTopK:
    """The teacher's k likeliest tokens at every completion position (algo.distill_top_k) and the loss
    term's weight (algo.distill_coef)."""

    ids: torch.Tensor  # (N, T, K) token ids, long
    logp: torch.Tensor  # (N, T, K) the teacher's log-probabilities of them (full-vocabulary softmax)
    coef: float

    def rows(self, rows: slice) -> "TeacherTopK":
        return dataclasses.replace(self, ids=self.ids[rows], logp=self.logp[rows])


def forward_kl_loss(
    top: TeacherTopK,
    student_logp_NTK: torch.Tensor,
    mask_NT: torch.Tensor,
    norms: Normalisers,
    seq_weights_N: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``coef`` times the top-k forward KL reduced as the policy loss is (``norms``: the aggregation and
    the whole batch's counts, so micro-batches add up), and the token sums of ``distill/forward_kl`` and
    ``distill/top_k_mass`` (the teacher's mass on its k tokens), to be divided by the loss tokens."""
    kl_NT = forward_kl_top_k(top.logp.to(student_logp_NTK.device), student_logp_NTK)
    mask = mask_NT.to(kl_NT.device, kl_NT.dtype)
    loss = aggregate(
        kl_NT,
        mask,
        norms.aggregation,
        num_sequences=norms.num_sequences,
        num_tokens=norms.num_tokens,
        norm_constant=norms.norm_constant,
        seq_weights_N=seq_weights_N,
    )
    with torch.no_grad():
        mass_NT = top.logp.to(mask.device).float().exp().sum(dim=-1)
        sums = {"distill/forward_kl": float((kl_NT * mask).sum()), "distill/top_k_mass": float((mass_NT * mask).sum())}
    return top.coef * loss, sums


def distill_config_errors(cfg) -> list[str]:
    """One sentence per distillation setting that cannot run as given."""
    a = cfg.algo
    errors = []
    if a.distill_estimator not in DISTILL_ESTIMATORS:
        errors.append(f"algo.distill_estimator={a.distill_estimator!r} is not valid; valid: k1, k3")
    if not math.isfinite(a.distill_coef) or a.distill_coef < 0:
        errors.append(f"algo.distill_coef={a.distill_coef} must be >= 0 (0: no per-token distillation reward)")
    if a.distill_top_k < 0:
        errors.append(f"algo.distill_top_k={a.distill_top_k} must be >= 0 (0: no forward KL on the teacher's top-k)")
    if a.distill_top_k > 0 and a.distill_coef <= 0:
        errors.append(
            f"algo.distill_top_k={a.distill_top_k} needs algo.distill_coef > 0 (the forward-KL term's loss weight)"
        )
    if a.distill_coef > 0 and not a.distill_teacher:
        errors.append(f"algo.distill_coef={a.distill_coef} needs a teacher; set algo.distill_teacher")
    if a.distill_teacher and a.beta <= 0 and a.distill_coef <= 0:
        errors.append(
            f"algo.distill_teacher={a.distill_teacher!r} is set but unused; set algo.distill_coef > 0 (a per-token "
            "reward) or algo.beta > 0 (the KL to the teacher in the loss)"
        )
    if a.distill_teacher and a.ref_refresh_every:
        errors.append(
            "algo.ref_refresh_every would overwrite the teacher (it holds the reference's place); set it to 0"
        )
    return errors


@register_advantage_stage(
    "distill",
    StageSpec(
        needs_old=True,
        active=lambda s: s.algo.distill_coef > 0 and s.algo.distill_top_k <= 0,  # top-k: coef weighs the loss term
        config_errors=distill_config_errors,
    ),
)
def distill_advantages(ctx, advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """The advantages, per token, plus ``distill_coef`` times the teacher's per-token reward."""
    a, lp, mask = ctx.settings.algo, ctx.logprobs, ctx.tokens.completion_mask
    r_NT = distill_token_rewards(lp.old, lp.ref.to(lp.old.device), mask.to(lp.old.device), a.distill_estimator)
    adv_NT = advantages[:, None] if advantages.dim() == 1 else advantages
    out = adv_NT.to(r_NT.device) * mask.to(r_NT.device) + a.distill_coef * r_NT
    n = mask.sum().clamp(min=1)
    kl = {"distill/reverse_kl": (-(r_NT).sum() / n).item()}  # this rank's tokens: pooled over ranks by their count
    return out, {**kl, **part_weights({"distill/reverse_kl": mask.sum()}), "distill/coef": float(a.distill_coef)}
