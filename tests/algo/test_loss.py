"""Policy loss: hand-worked clipping and KL values, and the properties the trainer relies on."""

import math

import pytest
import torch

from grpokit.algo.loss import AGGREGATIONS, aggregate, kl_estimate, lambda_weights, policy_loss


def one_token(ratio: float, adv: float, **kw):
    """Loss and d loss / d logp for a single token with the given ratio and advantage."""
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, m = policy_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1), **kw)
    loss.backward()
    return loss.item(), logp.grad.item(), m


def test_clip_high_side():
    # A = +1, ratio 1.5, eps 0.2: min(1.5 * 1, 1.2 * 1) = 1.2 -> loss -1.2, clipped, no gradient
    loss, grad, m = one_token(1.5, 1.0)
    assert loss == pytest.approx(-1.2) and grad == 0.0
    assert m["clip_ratio/high_mean"] == 1.0 and m["clip_ratio/low_mean"] == 0.0


def test_clip_low_side():
    # A = -1, ratio 0.5: min(0.5 * -1, 0.8 * -1) = -0.8 -> loss 0.8, clipped, no gradient
    loss, grad, m = one_token(0.5, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0
    assert m["clip_ratio/low_mean"] == 1.0 and m["clip_ratio/region_mean"] == 1.0


def test_unclipped_sides_keep_gradient():
    # A = +1, ratio 0.5: min(0.5, 0.8) = 0.5 -> loss -0.5; d/dlogp of -ratio*A = -ratio = -0.5
    loss, grad, m = one_token(0.5, 1.0)
    assert loss == pytest.approx(-0.5) and grad == pytest.approx(-0.5)
    assert m["clip_ratio/region_mean"] == 0.0
    # A = -1, ratio 1.5: min(-1.5, -1.2) = -1.5 -> loss 1.5; gradient ratio * 1 = 1.5
    loss, grad, _ = one_token(1.5, -1.0)
    assert loss == pytest.approx(1.5) and grad == pytest.approx(1.5)


def test_clip_higher_dapo():
    # eps_low 0.2, eps_high 0.28: ratio 1.25 with A = +1 is inside [0.8, 1.28] -> loss -1.25
    loss, grad, m = one_token(1.25, 1.0, clip_low=0.2, clip_high=0.28)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25)
    # but ratio 0.75 with A = -1 is below 0.8 -> clipped to 0.8 * -1 -> loss 0.8
    loss, grad, _ = one_token(0.75, -1.0, clip_low=0.2, clip_high=0.28)
    assert loss == pytest.approx(0.8) and grad == 0.0


def test_dual_clip_bounds_negative_advantage():
    # A = -1, ratio 4: min(-4, -1.2) = -4; dual clip 3: max(-4, 3 * -1) = -3 -> loss 3, no gradient
    loss, grad, m = one_token(4.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0) and grad == 0.0 and m["clip_ratio/dual_mean"] == 1.0
    # without dual clip the loss is 4
    assert one_token(4.0, -1.0)[0] == pytest.approx(4.0)


def test_kl_estimators_known_values():
    # pi = 0.5, pi_ref = 0.25: d = log(0.25/0.5) = -0.693147
    # k1 = -d = 0.693147 ; k2 = d^2/2 = 0.240227 ; k3 = e^d - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(0.693147, abs=1e-5)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.240227, abs=1e-5)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.193147, abs=1e-5)
    # equal policies: every estimator is 0
    for k in ("k1", "k2", "k3"):
        assert kl_estimate(logp, logp, k).item() == 0.0


def test_kl_in_loss_weighted_by_beta():
    # ratio 1, A = 0: surrogate 0; k3 = 0.193147 on the one token; beta 0.04 -> loss 0.0077259
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    loss, m = policy_loss(logp, logp, torch.zeros(1), torch.ones(1, 1), ref_logp_NT=ref, beta=0.04)
    assert loss.item() == pytest.approx(0.04 * 0.193147, abs=1e-6)
    assert m["kl"] == pytest.approx(0.193147, abs=1e-5)


def test_beta_zero_needs_no_reference():
    logp = torch.randn(2, 3)
    loss, m = policy_loss(logp, logp, torch.ones(2), torch.ones(2, 3), beta=0.0, ref_logp_NT=None)
    assert "kl" not in m and torch.isfinite(loss)
    with pytest.raises(ValueError, match="ref_logp_NT"):
        policy_loss(logp, logp, torch.ones(2), torch.ones(2, 3), beta=0.1)


def test_aggregation_modes_hand_worked():
    # two sequences: [1, 2, (pad)] and [3, (pad), (pad)]
    loss = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # seq-mean-token-mean: ((1+2)/2 + 3/1) / 2 = (1.5 + 3) / 2 = 2.25
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.25)
    # token-mean: (1 + 2 + 3) / 3 = 2
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(2.0)
    # seq-mean-token-sum-norm with C = 4: (1 + 2 + 3) / (2 * 4) = 0.75
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", norm_constant=4).item() == pytest.approx(0.75)
    # seq-mean-token-sum: (3 + 3) / 2 = 3
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="valid: seq-mean-token-mean"):
        aggregate(loss, mask, "mean")


def _batch(seed=0, N=6, T=5):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=g) * 2
    old = logp + 0.3 * torch.randn(N, T, generator=g)
    ref = logp + 0.3 * torch.randn(N, T, generator=g)
    adv = torch.randn(N, generator=g)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])[:N]
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    return logp, old, ref, adv, mask


def test_zero_advantage_gives_zero_policy_gradient():
    logp, old, _, _, mask = _batch()
    logp.requires_grad_(True)
    loss, _ = policy_loss(logp, old, torch.zeros(6), mask)
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros_like(logp))


def _lambda_w(agg, mask):
    """lambda-GRPO's per-sequence weights at a fixed lambda (groups of 3), for aggregation="lambda-grpo"."""
    return lambda_weights(mask.sum(1), 3, 0.7) if agg == "lambda-grpo" else None


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_ratio_one_without_clipping_is_reinforce(agg):
    # with old == logp (ratio 1) the gradient is that of  -A * logp  aggregated the same way
    logp, _, _, adv, mask = _batch()
    w = _lambda_w(agg, mask)
    a = logp.clone().requires_grad_(True)
    loss, _ = policy_loss(a, a.detach(), adv, mask, aggregation=agg, norm_constant=5, seq_weights_N=w)
    loss.backward()
    b = logp.clone().requires_grad_(True)
    aggregate(-adv[:, None] * b, mask, agg, norm_constant=5, seq_weights_N=w).backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


@pytest.mark.parametrize("level", ["token", "sequence", "sequence_whole"])
def test_masked_tokens_change_nothing(level):
    logp, old, ref, adv, mask = _batch()
    junk = (1 - mask) * 7.0  # change only masked positions
    outs = []
    for shift in (0.0, 1.0):
        x = (logp + shift * junk).requires_grad_(True)
        loss, m = policy_loss(
            x, old - shift * junk, adv, mask, ref_logp_NT=ref + shift * junk, beta=0.1, ratio_level=level
        )
        loss.backward()
        outs.append((loss.item(), x.grad * mask, m))
    assert outs[0][0] == pytest.approx(outs[1][0], abs=1e-6)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-6)
    assert outs[0][2] == pytest.approx(outs[1][2], abs=1e-6)


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("level", ["token", "sequence", "sequence_whole"])
def test_micro_batches_accumulate_to_full_batch(agg, level):
    logp, old, ref, adv, mask = _batch()
    w = _lambda_w(agg, mask)
    kw = dict(
        ref_logp_NT=None,
        beta=0.05,
        aggregation=agg,
        norm_constant=5,
        ratio_level=level,
        num_sequences=6,
        num_tokens=mask.sum().item(),
    )
    full = logp.clone().requires_grad_(True)
    loss_full, _ = policy_loss(full, old, adv, mask, **{**kw, "ref_logp_NT": ref}, seq_weights_N=w)
    loss_full.backward()
    micro = logp.clone().requires_grad_(True)
    total = 0.0
    for idx in (slice(0, 2), slice(2, 5), slice(5, 6)):
        part, _ = policy_loss(
            micro[idx],
            old[idx],
            adv[idx],
            mask[idx],
            **{**kw, "ref_logp_NT": ref[idx]},
            seq_weights_N=w[idx] if w is not None else None,
        )
        part.backward()
        total += part.item()
    assert total == pytest.approx(loss_full.item(), abs=1e-6)
    assert torch.allclose(micro.grad, full.grad, atol=1e-6)


def test_sequence_ratio_equals_token_ratio_for_one_token_completions():
    logp, old, _, adv, _ = _batch(T=1)
    mask = torch.ones(6, 1)
    res = {}
    for level in ("token", "sequence", "sequence_whole"):
        x = logp.clone().requires_grad_(True)
        loss, m = policy_loss(x, old, adv, mask, ratio_level=level)
        loss.backward()
        res[level] = (loss.item(), x.grad.clone(), m)
    for level in ("sequence", "sequence_whole"):
        assert res["token"][0] == pytest.approx(res[level][0], abs=1e-7)
        assert torch.allclose(res["token"][1], res[level][1], atol=1e-7)
        assert res["token"][2] == pytest.approx(res[level][2])


def test_gspo_sequence_ratio_hand_worked():
    # one sequence, two tokens with log-ratios 0.2 and 0.0: s = exp((0.2 + 0)/2) = exp(0.1) = 1.10517
    # A = +1, eps 0.2: inside the clip range -> loss = -1.10517 on each token, seq-mean-token-mean -> -1.10517
    # gradient: GSPO-token form gives d/dlogp_t = -s * A / |o| = -0.552585 on each token
    logp = torch.tensor([[0.2, 0.0]], requires_grad=True)
    loss, m = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), ratio_level="sequence")
    loss.backward()
    assert loss.item() == pytest.approx(-1.10517, abs=1e-5)
    assert logp.grad.tolist()[0] == pytest.approx([-0.552585, -0.552585], abs=1e-5)
    assert m["ratio/mean"] == pytest.approx(1.10517, abs=1e-5)


@pytest.mark.parametrize("level", ["sequence", "sequence_whole"])
def test_gspo_forms_agree_without_a_per_token_factor(level):
    # both forms: s = exp(0.1) on each token, d/dlogp_t = -s * A / |o| = -0.552585 (the hand-worked case above)
    logp = torch.tensor([[0.2, 0.0]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), ratio_level=level)
    loss.backward()
    assert loss.item() == pytest.approx(-1.10517, abs=1e-5)
    assert logp.grad.tolist()[0] == pytest.approx([-0.552585, -0.552585], abs=1e-5)


@pytest.mark.parametrize(
    "factor, token_form, whole_form",
    [
        # the entropy top-fraction keeps token 0 only (a policy mask [1, 0]); one sequence of two tokens, ratio 1,
        # A = 1, seq-mean-token-mean: loss = -1/2 (m_0 r_0 + m_1 r_1) A.
        # GSPO-token (sequence): r_t = sg(s) pi_t / sg(pi_t): d/dlogp_0 = -1/2, d/dlogp_1 = 0 (masked: no gradient).
        # sequence_whole: loss = -1/2 (1 + 0) s, ds/dlogp_t = s / 2 = 1/2: d/dlogp_t = -1/4 on both tokens.
        ("policy_mask", [-0.5, 0.0], [-0.25, -0.25]),
        # TIS token weights [2, 0] as the pipeline applies them, a factor of the policy term (policy_weight_NT):
        # loss = -1/2 (2 r_0 + 0 r_1).
        # GSPO-token: d/dlogp_0 = -1/2 * 2 = -1, d/dlogp_1 = 0; sequence_whole: -1/2 * 2 * s/2 = -1/2 on both.
        ("tis", [-1.0, 0.0], [-0.5, -0.5]),
    ],
)
def test_gspo_forms_part_under_a_per_token_factor(factor, token_form, whole_form):
    for level, expected in (("sequence", token_form), ("sequence_whole", whole_form)):
        logp = torch.zeros(1, 2, requires_grad=True)
        weights = torch.tensor([[1.0, 0.0]] if factor == "policy_mask" else [[2.0, 0.0]])
        kw = {"policy_mask_NT" if factor == "policy_mask" else "policy_weight_NT": weights}
        loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), ratio_level=level, **kw)
        loss.backward()
        assert loss.item() == pytest.approx(-0.5 if factor == "policy_mask" else -1.0), level  # the same value
        assert logp.grad.tolist()[0] == pytest.approx(expected), level


def test_policy_weight_weighs_the_surrogate_and_leaves_the_clip_count():
    # one sequence of two tokens, A = +1, token-mean. Ratio 1 (logp = old = 0), weights [2, 0.5]:
    # loss = -(2 * 1 + 0.5 * 1) / 2 = -1.25, d/dlogp = -[2, 0.5] / 2 = [-1, -0.25]
    logp = torch.zeros(1, 2, requires_grad=True)
    kw = dict(aggregation="token-mean", policy_weight_NT=torch.tensor([[2.0, 0.5]]))
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), **kw)
    loss.backward()
    assert loss.item() == pytest.approx(-1.25) and logp.grad.tolist() == [[-1.0, -0.25]]
    # ratio e^0.5 = 1.65 > 1.2 on both tokens, weights [1, 0] (IcePop masked the second): both are clipped high,
    # high_mean 2/2 = 1 (the advantage's sign is the estimator's; A * w = 0 would have counted 1/2), and the loss
    # -(1.2 * 1 + 0) / 2 = -0.6 has no gradient (clipped)
    logp = torch.full((1, 2), 0.5, requires_grad=True)
    kw["policy_weight_NT"] = torch.tensor([[1.0, 0.0]])
    loss, m = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), **kw)
    loss.backward()
    assert loss.item() == pytest.approx(-0.6) and logp.grad.abs().sum() == 0
    assert (m["clip_ratio/high_mean"], m["clip_ratio/region_mean"], m["clip_ratio/high_max"]) == (1.0, 1.0, 1.0)


def test_offpolicy_mask_reads_the_unweighted_advantages():
    # per-token advantages [-3, 1] (mean -1 < 0), drift mean(old - logp) = 0.5 > delta 0.1: the row is dropped.
    # A weight [0, 1] on the advantages would have made their mean (0 + 1) / 2 = 0.5 > 0 and kept the row
    logp, old = torch.full((1, 2), -0.5), torch.zeros(1, 2)
    _, m = policy_loss(
        logp,
        old,
        torch.tensor([[-3.0, 1.0]]),
        torch.ones(1, 2),
        offpolicy_delta=0.1,
        policy_weight_NT=torch.tensor([[0.0, 1.0]]),
    )
    assert m["offpolicy/masked_sequences"] == 1.0


def test_per_token_advantages_accepted():
    logp = torch.zeros(1, 2, requires_grad=True)
    # ratio 1, A = [1, -1] per token, token-mean: loss = -(1 - 1)/2 = 0; grads -1/2 and +1/2
    loss, _ = policy_loss(
        logp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), aggregation="token-mean"
    )
    loss.backward()
    assert loss.item() == pytest.approx(0.0) and logp.grad.tolist() == [[-0.5, 0.5]]


def test_kl_clamp_bounds_the_estimate_and_stops_its_gradient():
    # d = ref - logp = 3: k3 = e^3 - 3 - 1 = 16.0855 -> clamped at 10 (verl's bound), no gradient
    # d = -0.693147: k3 = 0.193147 stays; k1 = -d: d = 3 gives -3 -> clamped at -2 with clamp 2
    logp = torch.tensor([0.0, 0.0], requires_grad=True)
    ref = torch.tensor([3.0, math.log(0.5)])
    k3 = kl_estimate(logp, ref, "k3", clamp=10.0)
    assert k3.tolist() == pytest.approx([10.0, 0.193147], abs=1e-5)
    k3.sum().backward()
    assert logp.grad[0].item() == 0.0 and logp.grad[1].item() == pytest.approx(1 - 0.5)  # dk3/dlogp = 1 - e^d
    assert kl_estimate(torch.zeros(1), torch.tensor([3.0]), "k1", clamp=2.0).item() == -2.0
    assert kl_estimate(torch.zeros(1), torch.tensor([3.0]), "k3").item() == pytest.approx(16.0855, abs=1e-4)
    with pytest.raises(ValueError, match="clamp must be > 0"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k3", clamp=0.0)


def test_kl_bias_correction_changes_the_gradient_on_policy():
    # one token, A = 0, on-policy (ratio 1), pi = 0.5, pi_ref = 0.25: d = ref - logp = -0.693147, e^d = 0.5
    # the value is beta * k3 = 0.04 * 0.193147 either way
    # plain k3: d/dlogp (beta k3) = beta (1 - e^d) = 0.04 * 0.5 = 0.02
    # corrected: d/dlogp (beta rho k3) = beta (k3 + 1 - e^d) = -beta d = 0.04 * 0.693147 = 0.0277259
    # (the gradient of beta * k1: the unbiased reverse-KL gradient); the difference is 7.7e-3
    ref = torch.tensor([[math.log(0.25)]])
    out = {}
    for corrected in (False, True):
        logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
        loss, m = policy_loss(
            logp,
            logp.detach(),
            torch.zeros(1),
            torch.ones(1, 1),
            ref_logp_NT=ref,
            beta=0.04,
            kl_bias_correction=corrected,
        )
        loss.backward()
        out[corrected] = (loss.item(), logp.grad.item(), m["kl"])
    assert out[False][0] == pytest.approx(0.04 * 0.193147, abs=1e-7) and out[True][0] == pytest.approx(out[False][0])
    assert out[False][1] == pytest.approx(0.02, abs=1e-7) and out[True][1] == pytest.approx(0.0277259, abs=1e-7)
    # off-policy the value is weighted too: ratio 2 -> beta * 2 * k3; the kl metric reports the weighted k3
    logp = torch.tensor([[math.log(0.5)]])
    loss, m = policy_loss(
        logp,
        logp - math.log(2.0),
        torch.zeros(1),
        torch.ones(1, 1),
        ref_logp_NT=ref,
        beta=0.04,
        kl_bias_correction=True,
    )
    assert loss.item() == pytest.approx(0.04 * 2 * 0.193147, abs=1e-6) and m["kl"] == pytest.approx(
        2 * 0.193147, abs=1e-5
    )


def test_kl_bias_correction_sequence_level_uses_the_sequence_weight():
    # one sequence, two tokens with log-ratios 0.2 and 0.0: weight exp(0.1) = 1.105171 on both tokens
    # d = ref - logp = -0.693147 on both: k3 = 0.193147; A = 0, seq-mean-token-mean, beta 1:
    # loss = 1.105171 * 0.193147 = 0.213463
    logp = torch.tensor([[0.2, 0.0]])
    loss, _ = policy_loss(
        logp,
        torch.zeros(1, 2),
        torch.zeros(1),
        torch.ones(1, 2),
        ref_logp_NT=logp + math.log(0.5),
        beta=1.0,
        kl_bias_correction=True,
        ratio_level="sequence",
    )
    assert loss.item() == pytest.approx(0.213463, abs=1e-5)


def test_entropy_bonus_aggregation_modes_hand_worked():
    # ratio 1, A = 0, entropy [[1, 2, (pad)], [3, (pad), (pad)]], coef 0.1, aggregation seq-mean-token-mean
    # "loss" (verl): -0.1 * ((1 + 2)/2 + 3/1) / 2 = -0.225 ; "token-mean" (TRL): -0.1 * (1 + 2 + 3)/3 = -0.2
    logp = torch.zeros(2, 3)
    ent = torch.tensor([[1.0, 2.0, 50.0], [3.0, 50.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    kw = dict(entropy_NT=ent, entropy_coef=0.1)
    assert policy_loss(logp, logp, torch.zeros(2), mask, **kw)[0].item() == pytest.approx(-0.225)
    assert policy_loss(logp, logp, torch.zeros(2), mask, entropy_aggregation="token-mean", **kw)[
        0
    ].item() == pytest.approx(-0.2)
    with pytest.raises(ValueError, match="valid: loss, token-mean"):
        policy_loss(logp, logp, torch.zeros(2), mask, entropy_aggregation="sum", **kw)


@pytest.mark.parametrize("entropy_aggregation", ["loss", "token-mean"])
@pytest.mark.parametrize("level", ["token", "sequence", "sequence_whole"])
def test_micro_batches_accumulate_with_kl_correction_clamp_and_entropy(entropy_aggregation, level):
    logp, old, ref, adv, mask = _batch()
    ent = torch.rand(6, 5, generator=torch.Generator().manual_seed(1)) * 3
    kw = dict(
        beta=0.05,
        aggregation="seq-mean-token-mean",
        ratio_level=level,
        num_sequences=6,
        num_tokens=mask.sum().item(),
        kl_bias_correction=True,
        kl_clamp=0.03,
        entropy_coef=0.01,
        entropy_aggregation=entropy_aggregation,
    )
    full, full_ent = logp.clone().requires_grad_(True), ent.clone().requires_grad_(True)
    loss_full, _ = policy_loss(full, old, adv, mask, ref_logp_NT=ref, entropy_NT=full_ent, **kw)
    loss_full.backward()
    micro, micro_ent = logp.clone().requires_grad_(True), ent.clone().requires_grad_(True)
    total = 0.0
    for idx in (slice(0, 2), slice(2, 5), slice(5, 6)):
        part, _ = policy_loss(
            micro[idx], old[idx], adv[idx], mask[idx], ref_logp_NT=ref[idx], entropy_NT=micro_ent[idx], **kw
        )
        part.backward()
        total += part.item()
    assert total == pytest.approx(loss_full.item(), abs=1e-6)
    assert torch.allclose(micro.grad, full.grad, atol=1e-6) and torch.allclose(micro_ent.grad, full_ent.grad, atol=1e-7)
    assert (kl_estimate(logp, ref, "k3")[mask.bool()] > 0.03).any()  # the clamp binds somewhere in this batch
