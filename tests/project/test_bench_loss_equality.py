"""grpokit's policy_loss equals TRL's GRPO loss on one fixed batch (TRL used as an oracle only).

The batch (bench/trl_oracle.fixed_batch) has ragged lengths, ratios both inside and outside
[0.8, 1.2] and advantages of both signs, so clipping, the k3 KL term (beta = 0.04) and each
aggregation are all exercised, with TRL's KL bias correction (``use_bias_correction_kl``, its
default) off and on, at token and sequence level, and with TRL's entropy bonus (a token mean), its
entropy mask (top_entropy_quantile) and its off-policy mask, both of which mask the policy term only; and
the clip metrics (per-sequence extremes; sequences counted at a sequence-level ratio).
Skipped when trl is not installed.
"""

import sys

import pytest
import torch

pytest.importorskip("trl")
from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from trl_oracle import TRL_TO_GRPOKIT, fixed_batch, grpokit_loss, trl_loss  # noqa: E402


def test_fixed_batch_exercises_clipping():
    logp, old, _, adv, mask = fixed_batch()
    ratio = torch.exp(logp - old)[mask.bool()]
    assert (ratio < 0.8).any() and (ratio > 1.2).any() and (adv > 0).any() and (adv < 0).any()


def _both(loss_type, beta, **kw):
    """(grpokit, TRL): losses, gradients wrt logp and logged metrics on the fixed batch."""
    logp, old, ref, adv, mask = fixed_batch()
    out = []
    for fn in (grpokit_loss, trl_loss):
        x, metrics = logp.clone().requires_grad_(True), {}
        loss = fn(
            x, old, ref, adv, mask, loss_type=loss_type, beta=beta, max_completion_length=9, metrics=metrics, **kw
        )
        loss.backward()
        out.append((loss, x.grad, metrics))
    return out


@pytest.mark.parametrize("loss_type", sorted(TRL_TO_GRPOKIT))
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("bias_correction", [False, True])
def test_loss_and_gradient_equal_trl(loss_type, beta, bias_correction):
    (ours, g_ours, m_ours), (theirs, g_theirs, m_theirs) = _both(loss_type, beta, bias_correction=bias_correction)
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6)
    assert torch.allclose(g_ours, g_theirs, atol=1e-7, rtol=1e-6)
    if beta:  # the logged KL is the (weighted) estimate both sides penalise
        assert m_ours["kl"] == pytest.approx(m_theirs["kl"], rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
@pytest.mark.parametrize("bias_correction", [False, True])
def test_sequence_level_ratio_equals_trl(loss_type, bias_correction):
    (ours, g_ours, _), (theirs, g_theirs, _) = _both(loss_type, 0.04, bias_correction=bias_correction, level="sequence")
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6)
    assert torch.allclose(g_ours, g_theirs, atol=1e-7, rtol=1e-6)


def test_bias_correction_changes_the_gradient_even_on_policy():
    # TRL's default differs from the plain k3 gradient when old == logp: both sides agree on how much
    logp, _, ref, adv, mask = fixed_batch()
    grads = {}
    for bc in (False, True):
        for fn in (grpokit_loss, trl_loss):
            x = logp.clone().requires_grad_(True)
            fn(x, logp, ref, adv, mask, loss_type="dapo", beta=0.04, bias_correction=bc).backward()
            grads[(fn.__name__, bc)] = x.grad
    assert torch.allclose(grads[("grpokit_loss", True)], grads[("trl_loss", True)], atol=1e-8)
    assert torch.allclose(grads[("grpokit_loss", False)], grads[("trl_loss", False)], atol=1e-8)
    assert (grads[("grpokit_loss", True)] - grads[("grpokit_loss", False)]).abs().max() > 1e-4


@pytest.mark.parametrize("loss_type", sorted(TRL_TO_GRPOKIT))
def test_entropy_bonus_token_mean_equals_trl(loss_type):
    logp, old, ref, adv, mask = fixed_batch()
    ent = torch.rand(logp.shape, generator=torch.Generator().manual_seed(5)) * 2
    res = []
    for fn in (grpokit_loss, trl_loss):
        x, e = logp.clone().requires_grad_(True), ent.clone().requires_grad_(True)
        loss = fn(
            x,
            old,
            ref,
            adv,
            mask,
            loss_type=loss_type,
            beta=0.04,
            max_completion_length=9,
            bias_correction=True,
            entropy_NT=e,
            entropy_coef=0.01,
        )
        loss.backward()
        res.append((loss, x.grad, e.grad))
    assert torch.allclose(res[0][0], res[1][0], atol=1e-7, rtol=1e-6)
    assert torch.allclose(res[0][1], res[1][1], atol=1e-7, rtol=1e-6)
    assert torch.allclose(res[0][2], res[1][2], atol=1e-8) and res[0][2].abs().sum() > 0


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_trl_delta_equals_dual_clip(loss_type):
    # TRL's two-sided clipping caps the ratio at delta; for delta > 1 + epsilon_high that is exactly
    # dual-clip PPO's bound delta * A for A < 0 (and changes nothing for A > 0). The advantages are
    # negated so that most sequences have A < 0 and delta 1.3 binds on two tokens.
    logp, old, ref, adv, mask = fixed_batch()
    adv = -adv
    assert ((torch.exp(logp - old) > 1.3) & (adv[:, None] < 0) & mask.bool()).sum() >= 2
    res = {}
    for name, fn, delta in (("ours", grpokit_loss, 1.3), ("trl", trl_loss, 1.3), ("plain", grpokit_loss, None)):
        x = logp.clone().requires_grad_(True)
        loss = fn(
            x,
            old,
            ref,
            adv,
            mask,
            loss_type=loss_type,
            beta=0.04,
            max_completion_length=9,
            bias_correction=True,
            delta=delta,
        )
        loss.backward()
        res[name] = (loss, x.grad)
    assert torch.allclose(res["ours"][0], res["trl"][0], atol=1e-7, rtol=1e-6)
    assert torch.allclose(res["ours"][1], res["trl"][1], atol=1e-7, rtol=1e-6)
    assert not torch.allclose(res["ours"][0], res["plain"][0], atol=1e-5)


# -- CISPO and SAPO are TRL loss types too; the same batch, the same numbers


@pytest.mark.parametrize(
    "epsilon_high", [0.2, 1.3, 5.0]
)  # 1.3 truncates some weights, 5.0 none, 0.2 (TRL's cap with epsilon_high unset) all
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_cispo_equals_trl(epsilon_high, beta):
    logp, old, _, _, mask = fixed_batch()
    assert (torch.exp(logp - old)[mask.bool()] > 1.3).any()
    (ours, g_ours, m), (theirs, g_theirs, m_trl) = _both("cispo", beta, epsilon_high=epsilon_high)
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6)
    assert m["cispo_clip_ratio"] == pytest.approx(m_trl["cispo_clip_ratio"], rel=1e-6)  # capped tokens with A > 0
    assert torch.allclose(g_ours, g_theirs, atol=1e-7, rtol=1e-6)
    assert (m["clip_ratio/high_mean"] > 0) == (epsilon_high < 5.0)
    if epsilon_high == 0.2:  # every weight is capped: sg(0.2) * A * logp on every token
        assert m["clip_ratio/high_mean"] == 1.0
        assert 0 < m["cispo_clip_ratio"] < 1  # TRL counts only the tokens with A > 0: the check above can fail


@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.5, 2.0)])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_sapo_equals_trl(taus, level, beta):
    (ours, g_ours, _), (theirs, g_theirs, _) = _both("sapo", beta, tau_pos=taus[0], tau_neg=taus[1], level=level)
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6)
    assert torch.allclose(g_ours, g_theirs, atol=1e-7, rtol=1e-6)


# -- TRL 1.16's loss types luspo and vespo; the same batch, the same numbers


@pytest.mark.parametrize("level", ["sequence", "token"])  # LUSPO's paper setting is sequence; TRL's default token
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_luspo_equals_trl(level, beta):
    (ours, g_ours, _), (theirs, g_theirs, _) = _both("luspo", beta, level=level, bias_correction=True)
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6)
    assert torch.allclose(g_ours, g_theirs, atol=1e-7, rtol=1e-6)
    # LUSPO sums each completion's tokens: it is not GRPO's per-completion token mean
    (grpo, _, _), _ = _both("grpo", beta, level=level, bias_correction=True)
    assert not torch.allclose(ours, grpo, atol=1e-4)


@pytest.mark.parametrize("shape", [(2.0, 3.0, 3.0, 2.0), (1.0, 0.5, 4.0, 6.0)])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_vespo_equals_trl(shape, beta):
    # beta > 0 with TRL's KL bias correction off (its on-setting weights the KL per token, grpokit's
    # vespo ratio is per trajectory; the TRL layer refuses that pair)
    (ours, g_ours, m), (theirs, g_theirs, m_trl) = _both("vespo", beta, vespo=shape)
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6)
    assert torch.allclose(g_ours, g_theirs, atol=1e-7, rtol=1e-6)
    assert m["clip_ratio/region_mean"] == 0.0  # nothing is clipped: the weight fades instead
    assert m["vespo/phi_seq_mean"] == pytest.approx(m_trl["vespo/phi_seq_mean"], rel=1e-6)  # TRL's logged mean weight


def test_vespo_weight_by_hand():
    # phi(w) = exp(lam + k log w - lam w): phi(1) = e^lam e^-lam = 1; with (k, lam) = (2, 3) at w = 2:
    # exp(3 + 2 ln 2 - 6) = 4 e^-3 = 0.19915; a negative advantage uses (3, 2): exp(2 + 3 ln 2 - 4) = 8 e^-2 = 1.08268
    from grpokit.algo.vespo import gamma_weight

    ratio = torch.tensor([[1.0, 2.0, 2.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    phi = gamma_weight(ratio, adv, (2.0, 3.0), (3.0, 2.0))
    assert torch.allclose(phi, torch.tensor([[1.0, 0.19915, 1.08268]]), atol=1e-5)


# -- the entropy mask and the off-policy mask: TRL masks the policy term only, the KL stays on every token


ENT = torch.rand((6, 7), generator=torch.Generator().manual_seed(7)) * 3  # the fixed batch's token entropies


@pytest.mark.parametrize("loss_type", sorted(TRL_TO_GRPOKIT))
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("quantile", [0.2, 0.5])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_entropy_mask_equals_trl(loss_type, beta, quantile, level):
    # TRL's top_entropy_quantile multiplies the policy term by its mask, then adds the KL on every token and
    # divides by the completion mask's counts; grpokit's entropy_top stage is a policy-only mask (pipeline).
    # At sequence level TRL's ratio exp(mean log-ratio) takes every token's gradient (grpokit.trl's sequence_whole)
    (ours, g_ours, m), (theirs, g_theirs, m_trl) = _both(
        loss_type, beta, entropy_NT=ENT, top_entropy_quantile=quantile, bias_correction=True, level=level
    )
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6)
    assert torch.allclose(g_ours, g_theirs, atol=1e-7, rtol=1e-6)
    for k in ("clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max") + ("kl",) * bool(beta):
        assert m[k] == pytest.approx(m_trl[k], rel=1e-6, abs=1e-8), k  # over every completion token, as TRL
    _, _, _, _, mask = fixed_batch()
    kept = ENT >= torch.quantile(ENT[mask.bool()], 1 - quantile)
    dropped = mask.bool() & ~kept
    # token level: a token out of the mask has no policy gradient, only the KL's (none at beta 0, some at 0.04);
    # sequence level: it moves through its sequence's ratio in the kept tokens' terms (TRL's GSPO)
    moved = g_ours[dropped].abs().sum() > 0
    assert moved == (bool(beta) or level == "sequence") and g_ours[mask.bool() & kept].abs().sum() > 0


SEQUENCE_LEVEL = [  # (top_entropy_quantile, beta with use_bias_correction_kl, off_policy_threshold, entropy_coef)
    (q, beta, opm, coef) for q in (1.0, 0.5) for beta in (0.0, 0.04) for opm in (None, 0.05) for coef in (0.0, 0.01)
]


@pytest.mark.parametrize("loss_type", [*sorted(TRL_TO_GRPOKIT), "luspo", "cispo", "sapo"])
def test_sequence_level_gradients_equal_trl(loss_type):
    # GSPO under grpokit.trl: every loss type at importance_sampling_level="sequence" with TRL's entropy mask, KL
    # (bias-corrected), off-policy mask and entropy bonus, each on and off: TRL's loss, its gradient with respect to
    # the log-probabilities and to the entropies (the bonus), and its clip metrics
    logp, old, ref, adv, mask = fixed_batch()
    for q, beta, opm, coef in SEQUENCE_LEVEL:
        res = []
        for fn in (grpokit_loss, trl_loss):
            x, e, metrics = logp.clone().requires_grad_(True), ENT.clone().requires_grad_(True), {}
            kw = dict(top_entropy_quantile=q, off_policy_threshold=opm, entropy_coef=coef, metrics=metrics)
            eps_high = 1.3 if loss_type == "cispo" else 0.28
            loss = fn(
                x,
                old,
                ref if beta else None,
                adv,
                mask,
                loss_type=loss_type,
                beta=beta,
                epsilon_high=eps_high,
                bias_correction=bool(beta),
                level="sequence",
                max_completion_length=9,
                entropy_NT=e,
                **kw,
            )
            loss.backward()
            res.append((loss, x.grad, e.grad, metrics))
        (ours, g_ours, e_ours, m), (theirs, g_theirs, e_theirs, m_trl) = res
        case = f"q={q} beta={beta} opm={opm} coef={coef}"
        assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6), case
        assert torch.allclose(g_ours, g_theirs, atol=1e-7, rtol=1e-6), case
        assert (e_ours is None) == (e_theirs is None) and (e_ours is None or torch.allclose(e_ours, e_theirs)), case
        for k in ("clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max", "cispo_clip_ratio"):
            if k in m_trl:
                assert m[k] == pytest.approx(m_trl[k], rel=1e-6, abs=1e-8), (case, k)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_entropy_mask_with_the_entropy_bonus_equals_trl(loss_type):
    # TRL's bonus is the mean entropy over the tokens the mask keeps (its "effective mask")
    logp, old, ref, adv, mask = fixed_batch()
    res = []
    for fn in (grpokit_loss, trl_loss):
        x, e = logp.clone().requires_grad_(True), ENT.clone().requires_grad_(True)
        kw = dict(loss_type=loss_type, beta=0.04, max_completion_length=9, entropy_NT=e, entropy_coef=0.01)
        fn(x, old, ref, adv, mask, top_entropy_quantile=0.3, **kw).backward()
        res.append((x.grad, e.grad))
    assert torch.allclose(res[0][0], res[1][0], atol=1e-7, rtol=1e-6)
    assert torch.allclose(res[0][1], res[1][1], atol=1e-8) and res[0][1].abs().sum() > 0


def _drifted_batch():
    """The fixed batch with pi_theta drifted 0.35 below pi_old on every token: with delta 0.1 every
    negative-advantage sequence is masked (DeepSeek-V3.2), the positive ones are kept."""
    logp, old, ref, adv, mask = fixed_batch()
    return old - 0.35, old, ref, adv, mask


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_off_policy_mask_keeps_the_kl_as_trl(loss_type, beta):
    logp, old, ref, adv, mask = _drifted_batch()
    res = []
    for fn in (grpokit_loss, trl_loss):
        x, metrics = logp.clone().requires_grad_(True), {}
        kw = dict(loss_type=loss_type, beta=beta, max_completion_length=9, off_policy_threshold=0.1, metrics=metrics)
        fn(x, old, ref, adv, mask, **kw).backward()
        res.append((x.grad, metrics))
    (g_ours, m), (g_trl, _) = res
    assert torch.allclose(g_ours, g_trl, atol=1e-7, rtol=1e-6)
    assert m["offpolicy/masked_sequences"] == float((adv < 0).sum()) > 0
    # a masked sequence keeps its KL gradient (beta > 0) and nothing else
    assert (g_ours[adv < 0].abs().sum() > 0) == bool(beta)


# -- the clip metrics: per-sequence extremes, and sequences as the unit of a sequence-level ratio


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_clip_metrics_equal_trl(loss_type, level):
    (_, _, m), (_, _, m_trl) = _both(loss_type, 0.0, level=level)
    keys = ("low_mean", "high_mean", "region_mean", "low_min", "high_max")
    assert {k: m[f"clip_ratio/{k}"] for k in keys} == pytest.approx({k: m_trl[f"clip_ratio/{k}"] for k in keys})
    assert m_trl["clip_ratio/region_mean"] > 0


def test_clip_extremes_by_hand():
    # token level, 4 sequences of 5 tokens: seq 0 (A > 0) has 3 tokens at ratio e^0.5 = 1.65 > 1.2, seq 1
    # (A < 0) one at e^-0.5 = 0.61 < 0.8. Means over the 20 tokens: high 3/20, low 1/20; per sequence the
    # high shares are 3/5, 0, 0, 0 (max 0.6) and the low shares 0, 1/5, 0, 0 (min 0, not the mean 0.05)
    old = torch.full((4, 5), -1.0)
    logp = old.clone()
    logp[0, :3] += 0.5
    logp[1, :1] -= 0.5
    m, adv = {}, torch.tensor([1.0, -1.0, 1.0, -1.0])
    grpokit_loss(logp, old, old, adv, torch.ones(4, 5), loss_type="dapo", beta=0.0, metrics=m)
    assert (m["clip_ratio/high_mean"], m["clip_ratio/low_mean"]) == pytest.approx((0.15, 0.05))
    assert (m["clip_ratio/high_max"], m["clip_ratio/low_min"]) == pytest.approx((0.6, 0.0))


def test_sequence_level_clip_ratio_counts_sequences_by_hand():
    # GSPO: one ratio per sequence. Sequence 0 (8 tokens, A > 0) has ratio e^0.5 = 1.65 > 1.2, clipped; three
    # 2-token sequences are not. TRL counts sequences: 1 of 4 = 0.25, where a token count would say 8/14 = 0.571
    mask = torch.zeros(4, 8)
    mask[0] = 1
    mask[1:, :2] = 1
    old = torch.full((4, 8), -1.0)
    logp = old.clone()
    logp[0] += 0.5
    ours, trl = {}, {}
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    grpokit_loss(logp, old, old, adv, mask, loss_type="grpo", beta=0.0, level="sequence", metrics=ours)
    trl_loss(logp, old, old, adv, mask, loss_type="grpo", beta=0.0, level="sequence", metrics=trl)
    assert ours["clip_ratio/high_mean"] == ours["clip_ratio/region_mean"] == trl["clip_ratio/high_mean"] == 0.25
    assert ours["clip_ratio/high_max"] == trl["clip_ratio/high_max"] == 1.0
