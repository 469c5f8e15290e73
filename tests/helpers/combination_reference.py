"""The reference of tests/algo/test_combinations.py: one fixed batch and, for each option, the formula of
its paper, written here without grpokit's code (except the entropy-shaped and turn-level estimators,
whose advantages are taken from the registered estimator: they have hand-worked tests of their own).

A cell is a dict ``{dimension: value}`` of the table in tests/algo/test_combinations.py.
"""

from __future__ import annotations

import math

import torch

from grpokit.algo import registry
from grpokit.algo.contexts import AdvantageContext
from grpokit.algo.pipeline import advantage_params

# ---------------------------------------------------------------- one fixed batch: P = 2 prompts, G = 2, T = 4

G, T, BETA, TIS_CAP, LOW, HIGH, DELTA, C = 2, 4, 0.1, 2.0, 0.5, 2.0, 0.05, 5.0
REWARDS = [1.0, 0.0, 0.3, 0.8]
LOGP = torch.tensor([[-0.5, -1.0, -0.7, -0.2], [-0.9, -0.4, 0.0, 0.0], [-0.3, -1.2, -0.6, 0.0], [-0.8, 0.0, 0.0, 0.0]])
OLD2 = LOGP + torch.tensor([[0.3, -0.2, 0.1, 0.4], [-0.5, 0.2, 0, 0], [0.1, 0.3, -0.2, 0], [0.6, 0, 0, 0]])
REF = LOGP - torch.tensor([[0.2, 0.1, -0.3, 0.5], [0.4, -0.1, 0, 0], [0.0, 0.2, 0.3, 0], [-0.2, 0, 0, 0]])
ENT = torch.tensor([[0.9, 0.1, 0.5, 0.7], [0.3, 0.8, 0, 0], [0.2, 0.6, 0.4, 0], [1.1, 0, 0, 0]])
# the sampler's log-probabilities relative to pi_old: ratio pi_old / pi_sampler = exp(OFFSET)
SAMPLER_OFFSET = torch.tensor(
    [[0.1, math.log(3.0), -0.2, 0.0], [-0.05, 0.3, 0, 0], [0.2, -math.log(2.5), 0.1, 0], [0.0, 0, 0, 0]]
)
SINGLE = {"lengths": [4, 2, 3, 1], "model_mask": None, "turns": None}
MULTI = {
    "lengths": [4, 2, 3, 1],
    "model_mask": [[1, 1, 0, 1], [1, 1], [1, 0, 1], [1]],
    "turns": [[0, 0, 0, 1], [0, 0], [0, 0, 1], [0]],
    "states": [["a", "b"], ["a"], ["a", "c"], ["a"]],
}
FINISH = ["eos", "eos", "length", "eos"]  # row 2 was cut by the length limit


# ---------------------------------------------------------------- the reference, from the papers' formulas


def kl(cell, logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Schulman's estimators of KL(pi || pi_ref) per token, with d = log pi_ref - log pi; the table's
    kl value is "<placement>" (k3) or "<placement>_<estimator>"."""
    d = ref - logp
    estimator = cell["kl"].partition("_")[2] or "k3"
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return d**2 / 2
    return torch.exp(d) - d - 1  # DeepSeekMath eq. 4: pi_ref/pi - log(pi_ref/pi) - 1


def ref_rewards(cell, old, mask) -> torch.Tensor:
    r = torch.tensor(REWARDS)
    if cell["kl"].startswith("reward"):  # REINFORCE++: r_i - beta * sum_t KL_t(pi_old || pi_ref)
        r = r - BETA * (kl(cell, old, REF) * mask).sum(dim=1)
    return r


def sample_std(xs: list[float], weights: list[float] | None = None, bessel: bool = True) -> tuple[float, float]:
    """(mean, std) of xs, each weighing weights[i] (1 by default); the variance over n - 1 with Bessel."""
    w = weights or [1.0] * len(xs)
    n = sum(w)
    mean = sum(wi * x for wi, x in zip(w, xs)) / n
    var = sum(wi * (x - mean) ** 2 for wi, x in zip(w, xs)) / (n - 1 if bessel else n)
    return mean, math.sqrt(var)


def ref_group_advantages(kind: str, r: torch.Tensor, lengths: list[float]) -> torch.Tensor:
    if kind in ("batch", "batch_whiten", "token_whiten"):
        rs = r.tolist()
        c = [x - sum(rs[g - g % G : g - g % G + G]) / G for g, x in enumerate(rs)]  # group mean removed
        if kind == "batch":  # TRL scale_rewards="batch": c / (std of all P*G rewards + eps)
            return torch.tensor([x / (sample_std(rs)[1] + 1e-4) for x in c])
        if kind == "batch_whiten":  # every completion weighs one: (c - mean c) / (std c + eps)
            mu, sd = sample_std(c)
            return torch.tensor([(x - mu) / (sd + 1e-4) for x in c])
        mu, sd = sample_std(c, lengths)  # REINFORCE++-baseline, verl: c_i tiled over L_i tokens, eps in the sqrt
        return torch.tensor([(x - mu) / math.sqrt(sd**2 + 1e-4) for x in c])
    out = []
    for g in range(0, len(r), G):
        grp = r[g : g + G].tolist()
        mean = sum(grp) / G
        for x in grp:
            if kind == "rloo":  # leave-one-out baseline, no scale
                out.append(x - (sum(grp) - x) / (G - 1))
            elif kind == "dr":  # Dr. GRPO: no std
                out.append(x - mean)
            else:  # GRPO: unbiased std (population: over G) plus adv_eps; a flat group gets 0
                std = math.sqrt(sum((y - mean) ** 2 for y in grp) / (G if kind == "population" else G - 1))
                out.append(0.0 if max(grp) - min(grp) <= 1e-6 * max(abs(y) for y in grp) else (x - mean) / (std + 1e-4))
    return torch.tensor(out)


def ref_advantages(cell, cfg, r, sb, batch) -> torch.Tensor:
    if cell["advantage"] == "group":
        return ref_group_advantages(cell["normalisation"], r, batch.completion_mask.sum(dim=1).tolist())
    # GTPO / GRPO-S / GiGPO / GAGPO: the estimator alone (hand-worked in its own tests), on these rewards
    ctx = AdvantageContext(cfg.algo, sb, r, batch.completion_mask, ENT, G, _One(), params=advantage_params(cfg.algo))
    return registry.lookup("advantage", cell["advantage"])(ctx)[0]


class _One:
    active = False

    @staticmethod
    def gather_rows(x):
        return x

    local_rows = gather_varlen = gather_rows


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default)."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (pos - lo)


def ref_masks(cell, mask, old):
    """(loss mask, policy mask, per-token weights of the policy term) after the masks and the sampler
    corrections: the loss mask is every token that counts (normalisers, KL), the policy mask the tokens of the
    policy term, the weights the sampler corrections' factor of each token's term (TRL: loss times ratio)."""
    loss_mask, weight = mask.clone(), torch.ones_like(mask)
    policy_mask = loss_mask
    ratio = torch.exp(SAMPLER_OFFSET)  # pi_old / pi_sampler on each token
    real = mask > 0
    if cell["mask"] == "overlong":  # DAPO: truncated rows leave the loss
        loss_mask[2] = 0
    elif cell["mask"] == "entropy_top":  # the policy term keeps tokens at or above the real tokens' median entropy
        policy_mask = mask * (ENT >= quantile(ENT[real].tolist(), 0.5)).float()
    elif cell["mask"] == "tis":  # TIS: A times min(pi_old / pi_sampler, cap)
        weight = torch.where(real, ratio.clamp(max=TIS_CAP), torch.ones_like(ratio))
    elif cell["mask"] == "icepop":  # IcePop: tokens with ratio outside [low, high] leave the gradient
        weight = torch.where(real & ((ratio < LOW) | (ratio > HIGH)), 0.0, 1.0)
    elif cell["mask"] == "mis":  # MIS: rows whose geometric-mean ratio is outside [low, high]
        geo = torch.exp((SAMPLER_OFFSET * mask).sum(dim=1) / mask.sum(dim=1))
        weight = torch.where(real & ((geo < LOW) | (geo > HIGH))[:, None], 0.0, 1.0)
    return loss_mask, policy_mask * loss_mask, weight


def own_token(log_s: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """GSPO-token (Zheng et al. 2025): s_it = sg[s_i] * pi(o_it) / sg[pi(o_it)], in logs: the value log s_i,
    the gradient token t's own log-probability's."""
    return log_s.detach() + logp - logp.detach()


def ref_log_ratio(cell, logp, old, mask, turns) -> torch.Tensor:
    d = (logp - old) * mask
    if cell["ratio"] == "token":
        return d
    if cell["ratio"] in ("sequence", "sequence_whole"):  # GSPO: mean log-ratio of the sequence
        log_s = (d.sum(dim=1) / mask.sum(dim=1))[:, None].expand_as(d)
        # sequence: the GSPO-token form; sequence_whole: GSPO's sequence objective, s_i with its gradient
        return own_token(log_s, logp) if cell["ratio"] == "sequence" else log_s
    if cell["ratio"] == "trajectory":  # TIC-GRPO: the product of the token ratios
        return d.sum(dim=1)[:, None].expand_as(d)
    out = torch.zeros_like(d)  # GAGPO: mean log-ratio of each turn's model tokens, in the GSPO-token form
    for i in range(d.shape[0]):
        for t in range(T):
            same = [u for u in range(T) if turns[i][u] == turns[i][t] and mask[i, u] > 0]
            out[i, t] = sum(d[i, u] for u in same) / max(len(same), 1)
    return own_token(out, logp)


def ref_objective(cell, rho, adv, logp) -> torch.Tensor:
    """The per-token loss of the objective (the negative of what it maximises)."""
    if cell["objective"] == "cispo":  # sg(min(rho, 1 + eps_high)) * A * log pi
        return -torch.clamp(rho, max=1.2).detach() * adv * logp
    if cell["objective"] == "sapo":  # sigmoid(tau (rho - 1)) * 4 / tau * A, tau by the sign of A
        tau = torch.where(adv > 0, 1.0, 1.05)
        return -torch.sigmoid(tau * (rho - 1)) * 4 / tau * adv
    return -torch.minimum(rho * adv, torch.clamp(rho, 0.8, 1.2) * adv)  # PPO's clipped surrogate


def ref_aggregate(cell, loss, mask) -> torch.Tensor:
    n_tok = mask.sum()
    if cell["aggregation"] == "token-mean":
        return (loss * mask).sum() / n_tok
    if cell["aggregation"] == "seq-mean-token-sum-norm":
        return (loss * mask).sum() / (4 * C)
    if cell["aggregation"] == "seq-mean-token-sum":
        return (loss * mask).sum() / 4
    return ((loss * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum() / 4


def reference(cell, cfg, sb, batch, old, logp=LOGP):
    """(advantages (N, T) on real tokens, loss mask, loss) from the formulas above; ``logp`` (pi_theta,
    LOGP's values) may carry a gradient, which the loss then takes."""
    mask = batch.completion_mask
    r = ref_rewards(cell, old, mask)
    adv = ref_advantages(cell, cfg, r, sb, batch)
    adv_NT = (adv[:, None] if adv.dim() == 1 else adv).expand(4, T).clone()
    loss_mask, policy_mask, weight = ref_masks(cell, mask, old)
    turns = [row + [0] * (T - len(row)) for row in (MULTI["turns"] if cell["turns"] == "multi" else [[0] * T] * 4)]
    rho = torch.exp(ref_log_ratio(cell, logp, old, mask, turns))
    if cell["mask"] == "offpolicy":  # DeepSeek-V3.2: the policy term of negative rows drifted by more than delta
        n = loss_mask.sum(dim=1)
        drift = ((old - LOGP) * loss_mask).sum(dim=1) / n
        mean_adv = (adv_NT * loss_mask).sum(dim=1) / n
        policy_mask = policy_mask * (~((mean_adv < 0) & (drift > DELTA)))[:, None]
    # the policy term on its own tokens; the KL on every token of the loss mask (the papers' objectives, TRL)
    loss = ref_objective(cell, rho, adv_NT, logp) * policy_mask * weight
    if cell["kl"].startswith("loss"):  # GRPO: beta * KL_k(pi_theta || pi_ref) per token
        loss = loss + BETA * kl(cell, logp, REF)
    return adv_NT, loss_mask, ref_aggregate(cell, loss, loss_mask)
