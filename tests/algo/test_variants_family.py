"""CISPO, SAPO, TIC-GRPO and GRPO at G=2 (on-policy DPO), on hand-made batches.

Every expected number is worked out in the comments. The equality of CISPO and SAPO with TRL's
own loss on a random batch is in test_bench_loss_equality.py.
"""

import math

import pytest
import torch

from grpokit.algo.advantages import group_advantages
from grpokit.algo.loss import policy_loss
from grpokit.algo.ratio import log_importance_ratio
from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.validation import validate


def _grad(adv, logp, old, mask=None, **kw):
    x = logp.clone().requires_grad_(True)
    loss, m = policy_loss(x, old, adv, torch.ones_like(logp) if mask is None else mask, **kw)
    loss.backward()
    return loss.detach(), x.grad, m


# ---------------------------------------------------------------- CISPO (MiniMax-M1)


def test_cispo_keeps_the_gradient_ppo_drops():
    # one sequence, two tokens, A = +1, ratios rho = [2.0, 0.5], clip_high = 0.2
    # CISPO weights sg(min(rho, 1.2)) = [1.2, 0.5]; logp = [-1, -2]; token-mean over 2 tokens:
    #   loss = -(1.2 * 1 * -1 + 0.5 * 1 * -2) / 2 = -(-1.2 - 1.0) / 2 = 1.1
    #   d loss / d logp = -[1.2, 0.5] / 2 = [-0.6, -0.25]
    logp = torch.tensor([[-1.0, -2.0]])
    old = logp - torch.log(torch.tensor([[2.0, 0.5]]))
    adv = torch.tensor([1.0])
    loss, g, m = _grad(adv, logp, old, objective="cispo", clip_high=0.2, aggregation="token-mean")
    assert loss.item() == pytest.approx(1.1, abs=1e-6)
    assert torch.allclose(g, torch.tensor([[-0.6, -0.25]]), atol=1e-6)
    assert m["clip_ratio/high_mean"] == 0.5  # token 0's weight was truncated
    # PPO's clip: token 0 (rho = 2 > 1.2, A > 0) sits on the flat clipped branch -> gradient 0;
    # token 1 (rho = 0.5, A > 0): min(0.5, 0.8) = 0.5 unclipped -> d/dlogp = -rho * A / 2 = -0.25
    _, g_ppo, _ = _grad(adv, logp, old, objective="clip", clip_high=0.2, aggregation="token-mean")
    assert torch.allclose(g_ppo, torch.tensor([[0.0, -0.25]]), atol=1e-6)


def test_cispo_has_no_lower_bound_and_ignores_the_sign_of_a():
    # rho = 0.1 (far below 1 - clip_low = 0.8), A = -2: weight 0.1 (no lower bound, as the paper
    # runs it), d loss / d logp = -0.1 * -2 = 0.2 (one token, token-mean over 1)
    logp = torch.tensor([[-1.0]])
    old = logp - math.log(0.1)
    _, g, _ = _grad(
        torch.tensor([-2.0]), logp, old, objective="cispo", clip_low=0.2, clip_high=0.2, aggregation="token-mean"
    )
    assert g.item() == pytest.approx(0.2, rel=1e-5)


# ---------------------------------------------------------------- SAPO (soft gate)


def test_sapo_gate_values_and_gradients():
    # token 0: rho = 1, A = +2, tau_pos = 1: f(1) = sigmoid(0) * 4 / 1 = 2, objective 2 * 2 = 4;
    #   d f(rho) / d logp = 4 sigmoid(0)(1 - sigmoid(0)) * rho = 1, so d loss / d logp = -A = -2
    # token 1: rho = 2, A = -1, tau_neg = 2: f(2) = sigmoid(2) * 4 / 2 = 0.880797 * 2 = 1.761594,
    #   objective -1.761594; d f / d logp = tau sigmoid(2)(1 - sigmoid(2)) * 4 / tau * rho
    #   = 4 * 0.880797 * 0.119203 * 2 = 0.839949, so d loss / d logp = -(-1) * 0.839949 = 0.839949
    # two sequences of one token, seq-mean-token-mean: loss = (-4 + 1.761594) / 2 = -1.119203,
    # gradients halved: [-1, 0.419974]
    logp = torch.tensor([[-1.0], [-1.0]])
    old = logp - torch.log(torch.tensor([[1.0], [2.0]]))
    loss, g, m = _grad(torch.tensor([2.0, -1.0]), logp, old, objective="sapo", sapo_tau_pos=1.0, sapo_tau_neg=2.0)
    assert loss.item() == pytest.approx(-1.119203, abs=1e-5)
    assert torch.allclose(g, torch.tensor([[-1.0], [0.419974]]), atol=1e-5)
    assert m["clip_ratio/region_mean"] == 0.0  # SAPO clips nothing
    # PPO's clip on token 1 (rho = 2, A < 0): min(-2, -1.2) = -2, unclipped: d loss / d logp = -rho A = 2,
    # halved: 1.0 -- SAPO's 0.42 is the same direction, faded
    _, g_ppo, _ = _grad(torch.tensor([2.0, -1.0]), logp, old)
    assert g_ppo[1].item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    "objective,kw", [("sapo", {"sapo_tau_pos": 0.3, "sapo_tau_neg": 3.0}), ("cispo", {"clip_high": 0.1})]
)
def test_on_policy_every_objective_is_reinforce(objective, kw):
    # property: at rho = 1 (old == logp) the gradient of CISPO and SAPO equals the clipped
    # surrogate's, i.e. REINFORCE with baseline -A grad logp, whatever the temperatures / caps
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(4, 5, generator=g) * 2
    adv = torch.randn(4, generator=g)
    mask = (torch.arange(5)[None] < torch.tensor([[5], [3], [1], [4]])).float()
    _, g_obj, _ = _grad(adv, logp, logp, mask, objective=objective, **kw)
    _, g_clip, _ = _grad(adv, logp, logp, mask)
    assert torch.allclose(g_obj, g_clip, atol=1e-6)


# ---------------------------------------------------------------- TIC-GRPO vs GSPO


def test_trajectory_ratio_is_the_product_gspo_the_geometric_mean():
    # token log-ratios [0.1, 0.2] and a padded third token (log-ratio 5, masked):
    # TIC-GRPO: log w = 0.1 + 0.2 = 0.3 (product of the ratios); GSPO: log s = 0.3 / 2 = 0.15
    logp = torch.tensor([[0.1, 0.2, 5.0]])
    old = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    traj = log_importance_ratio(logp, old, mask, "trajectory")
    seq = log_importance_ratio(logp, old, mask, "sequence")
    assert traj[0, :2].tolist() == pytest.approx([0.3, 0.3])
    assert seq[0, :2].tolist() == pytest.approx([0.15, 0.15])
    # in general: trajectory ratio = sequence ratio ** |o|
    g = torch.Generator().manual_seed(1)
    lp, ol = -torch.rand(3, 6, generator=g), -torch.rand(3, 6, generator=g)
    m = (torch.arange(6)[None] < torch.tensor([[6], [2], [4]])).float()
    t, s = log_importance_ratio(lp, ol, m, "trajectory")[:, 0], log_importance_ratio(lp, ol, m, "sequence")[:, 0]
    assert torch.allclose(t, s * m.sum(1), atol=1e-6)


def test_tic_grpo_clips_the_trajectory_ratio():
    # log-ratios [0.1, 0.2], A = +1, clip [0.8, 1.2]:
    # TIC-GRPO: w = e^0.3 = 1.349859 > 1.2 -> clipped: loss = -1.2, gradient 0
    # GSPO:     s = e^0.15 = 1.161834 < 1.2 -> loss = -1.161834, gradient per token -s / 2 = -0.580917
    logp, old = torch.tensor([[0.1, 0.2]]), torch.zeros(1, 2)
    adv = torch.tensor([1.0])
    loss, g, m = _grad(adv, logp, old, ratio_level="trajectory")
    assert loss.item() == pytest.approx(-1.2, abs=1e-6) and torch.equal(g, torch.zeros(1, 2))
    assert m["clip_ratio/high_mean"] == 1.0
    loss, g, _ = _grad(adv, logp, old, ratio_level="sequence")
    assert loss.item() == pytest.approx(-math.exp(0.15), abs=1e-6)
    assert torch.allclose(g, torch.full((1, 2), -math.exp(0.15) / 2), atol=1e-6)
    # unclipped (clip_high = 1): loss = -w = -1.349859, and d w / d logp_t = w for every token
    # (the product's gradient: w * sum_t grad logp_t), seq-mean-token-mean of a constant leaves -w
    loss, g, _ = _grad(adv, logp, old, ratio_level="trajectory", clip_high=1.0)
    assert loss.item() == pytest.approx(-math.exp(0.3), abs=1e-6)
    assert torch.allclose(g, torch.full((1, 2), -math.exp(0.3)), atol=1e-6)


def test_tic_grpo_on_policy_is_the_unnormalised_sequence_gradient():
    # property: at old == logp, w = 1 and the gradient is A_i sum_t grad logp_t per sequence, i.e.
    # token-level GRPO with token *sums* (seq-mean-token-sum), not GRPO's 1/|o_i| token mean
    g = torch.Generator().manual_seed(2)
    logp = -torch.rand(3, 4, generator=g)
    adv = torch.randn(3, generator=g)
    mask = (torch.arange(4)[None] < torch.tensor([[4], [2], [3]])).float()
    _, g_tic, _ = _grad(adv, logp, logp, mask, ratio_level="trajectory")
    _, g_sum, _ = _grad(adv, logp, logp, mask, aggregation="seq-mean-token-sum")
    assert torch.allclose(g_tic, g_sum, atol=1e-6)
    assert torch.equal(g_tic * (1 - mask), torch.zeros_like(g_tic))  # padding gets nothing


# ---------------------------------------------------------------- GRPO at G = 2 is on-policy DPO


def _pair_policy():
    """A context-free policy over a 5-token vocabulary: logits theta_TV per position; a winner of 3
    tokens and a loser of 2 (padded to 3). Returns theta, token ids, mask."""
    theta = torch.tensor(
        [[0.3, -0.2, 0.1, 0.0, 0.5], [0.0, 0.4, -0.3, 0.2, 0.1], [0.2, 0.2, -0.1, 0.3, 0.0]], requires_grad=True
    )
    ids = torch.tensor([[1, 4, 2], [3, 0, 0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return theta, ids, mask


def _token_logp(theta, ids):
    return torch.log_softmax(theta, dim=-1).gather(1, ids.T).T  # (2, 3)


def _dpo_grad(theta, ids, mask, ref_seq, beta, length_normalised=False):
    lp = (_token_logp(theta, ids) * mask).sum(1)
    if length_normalised:
        lp = lp / mask.sum(1)
    h = beta * ((lp[0] - ref_seq[0]) - (lp[1] - ref_seq[1]))
    (g,) = torch.autograd.grad(-torch.nn.functional.logsigmoid(h), theta)
    return g


def _grpo_grad(theta, ids, mask, std, aggregation):
    # rewards (1, 0) in one group of 2: mean 0.5, centred (+0.5, -0.5);
    # population std 0.5 -> A = (+1, -1); unbiased std 0.5 * sqrt(2) = 0.7071 -> A = (+0.7071, -0.7071)
    adv, _ = group_advantages(torch.tensor([[1.0, 0.0]]), std=std, eps=0.0)
    logp = _token_logp(theta, ids)
    loss, _ = policy_loss(logp, logp.detach(), adv[0], mask, aggregation=aggregation)  # on-policy, no KL
    (g,) = torch.autograd.grad(loss, theta)
    return g, adv[0]


def test_grpo_with_two_samples_is_dpo_at_the_reference():
    # GRPO, G = 2, population std, token sums, on-policy: loss gradient
    #   = -1/2 (A_w grad log pi(y_w) + A_l grad log pi(y_l)) = -1/2 (grad log pi(y_w) - grad log pi(y_l))
    # DPO, beta = 1, at pi = pi_ref (h = 0): -sigmoid(-h) * beta * (grad log pi(y_w) - grad log pi(y_l))
    #   = -1/2 (grad log pi(y_w) - grad log pi(y_l)): the same vector
    theta, ids, mask = _pair_policy()
    ref_seq = (_token_logp(theta, ids) * mask).sum(1).detach()
    g_grpo, adv = _grpo_grad(theta, ids, mask, "population", "seq-mean-token-sum")
    assert adv.tolist() == pytest.approx([1.0, -1.0])
    assert torch.allclose(g_grpo, _dpo_grad(theta, ids, mask, ref_seq, beta=1.0), atol=1e-7)
    # with Bessel's std (TRL / verl default) A = +-1/sqrt(2): DPO with beta = 1/sqrt(2) (beta * 1/2 = 0.7071 / 2)
    g_unb, _ = _grpo_grad(theta, ids, mask, "unbiased", "seq-mean-token-sum")
    assert torch.allclose(g_unb, _dpo_grad(theta, ids, mask, ref_seq, beta=1 / math.sqrt(2)), atol=1e-7)
    # GRPO's default 1/|o_i| token mean is DPO on length-normalised log-likelihoods
    ref_norm = ref_seq / mask.sum(1)
    g_mean, _ = _grpo_grad(theta, ids, mask, "population", "seq-mean-token-mean")
    assert torch.allclose(g_mean, _dpo_grad(theta, ids, mask, ref_norm, beta=1.0, length_normalised=True), atol=1e-7)


def test_grpo_two_samples_differs_from_dpo_away_from_the_reference():
    # once pi != pi_ref, DPO weighs the pair by sigmoid(-h) != 1/2; on-policy GRPO keeps weight 1/2
    # (its reference is always the sampling policy): the equality holds for on-policy DPO only
    theta, ids, mask = _pair_policy()
    # reference: ref_w = log pi(y_w), ref_l = log pi(y_l) + 1 (the policy has already pushed the loser down by 1)
    ref_seq = (_token_logp(theta, ids) * mask).sum(1).detach() + torch.tensor([0.0, 1.0])
    g_grpo, _ = _grpo_grad(theta, ids, mask, "population", "seq-mean-token-sum")
    g_dpo = _dpo_grad(theta, ids, mask, ref_seq, beta=1.0)
    # h = (lp_w - ref_w) - (lp_l - ref_l) = 0 - (-1) = 1: DPO's weight sigmoid(-1) = 0.268941, GRPO's 0.5
    assert torch.allclose(g_dpo, g_grpo * (torch.sigmoid(torch.tensor(-1.0)) / 0.5), atol=1e-6)
    assert not torch.allclose(g_dpo, g_grpo, atol=1e-3)


def test_grpo_two_samples_tied_pair_gives_no_gradient():
    # rewards (1, 1): a flat group, A = (0, 0) -> no gradient; DPO would need a preference to exist
    adv, m = group_advantages(torch.tensor([[1.0, 1.0]]), std="population")
    assert adv.tolist() == [[0.0, 0.0]] and m["frac_reward_zero_std"] == 1.0


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "override,message",
    [
        ("algo.objective=ppo", "algo.objective='ppo' is not valid; choose one of: clip, cispo, sapo"),
        ("algo.ratio_level=traj", "algo.ratio_level='traj' is not valid"),
        ("algo.sapo_tau_neg=0", "algo.sapo_tau_neg=0.0 must be > 0"),
    ],
)
def test_config_rejects_bad_values(override, message):
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(apply_overrides(Config(), [override]))


def test_dual_clip_only_with_the_clipped_surrogate():
    cfg = apply_overrides(Config(), ["algo.objective=cispo", "algo.dual_clip=3"])
    with pytest.raises(Exception, match="algo.dual_clip=3.0 bounds the clipped surrogate only"):
        validate(cfg)


@pytest.mark.parametrize(
    "kw",
    [
        {"objective": "cispo", "clip_high": 0.3, "aggregation": "token-mean"},
        {"objective": "sapo", "sapo_tau_pos": 0.5, "sapo_tau_neg": 2.0},
        {"ratio_level": "trajectory", "beta": 0.04, "kl_bias_correction": True},
    ],
)
def test_micro_batches_add_up_to_the_batch(kw):
    # property: two micro-batches divided by the whole batch's counts sum to the whole batch's loss
    # and gradient, off-policy (ratios e^(+-0.3)) and with ragged lengths
    g = torch.Generator().manual_seed(5)
    logp = -torch.rand(4, 5, generator=g) * 2
    old = logp + 0.3 * torch.randn(4, 5, generator=g)
    ref = logp + 0.2 * torch.randn(4, 5, generator=g)
    adv = torch.randn(4, generator=g)
    mask = (torch.arange(5)[None] < torch.tensor([[5], [2], [4], [1]])).float()
    counts = dict(num_sequences=4.0, num_tokens=float(mask.sum()))
    x = logp.clone().requires_grad_(True)
    full, _ = policy_loss(x, old, adv, mask, ref_logp_NT=ref, **counts, **kw)
    (g_full,) = torch.autograd.grad(full, x)
    parts = [
        policy_loss(x[r], old[r], adv[r], mask[r], ref_logp_NT=ref[r], **counts, **kw)[0]
        for r in (slice(0, 1), slice(1, 4))
    ]
    (g_parts,) = torch.autograd.grad(sum(parts), x)
    assert torch.allclose(sum(parts), full, atol=1e-6) and torch.allclose(g_parts, g_full, atol=1e-6)


# ---------------------------------------------------------------- EDGE-GRPO entropy-driven advantage


def test_edge_grpo_entropy_driven_advantage():
    from grpokit.algo.advantages import entropy_scaled_advantages, response_entropy

    # token entropies: seq 0 [0.4, 0.6] -> P = 0.5; seq 1 [1.0, 1.0] (+ a padded 9.0) -> 1.0; seq 2 [1.5] -> 1.5
    # batch mean P = 1.0, so the factors mean / P_i are [2, 1, 2/3]
    ent = torch.tensor([[0.4, 0.6, 0.0], [1.0, 1.0, 9.0], [1.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    P = response_entropy(ent, mask)
    assert P.tolist() == pytest.approx([0.5, 1.0, 1.5])
    adv = torch.tensor([1.0, -0.5, -0.5])
    # confident right answer: 1 * 2 = 2; the uncertain wrong one (P = 1.5) is pushed down less: -0.5 * 2/3
    out, m = entropy_scaled_advantages(adv, P, P.mean())
    assert out.tolist() == pytest.approx([2.0, -0.5, -1 / 3])
    assert m["eda/scale/max"] == pytest.approx(2.0)
    # the cap bounds the factor: min(2, 1.5) = 1.5
    out, _ = entropy_scaled_advantages(adv, P, P.mean(), max_scale=1.5)
    assert out.tolist() == pytest.approx([1.5, -0.5, -1 / 3])
    # per-token advantages are scaled row by row
    out, _ = entropy_scaled_advantages(adv[:, None].expand(3, 2), P, 1.0)
    assert torch.allclose(out, torch.tensor([[2.0, 2.0], [-0.5, -0.5], [-1 / 3, -1 / 3]]))
    # property: equal entropies change nothing; zero advantages stay zero
    assert torch.equal(entropy_scaled_advantages(adv, torch.full((3,), 0.7), 0.7)[0], adv)
    assert torch.equal(entropy_scaled_advantages(torch.zeros(3), P, 1.0)[0], torch.zeros(3))
