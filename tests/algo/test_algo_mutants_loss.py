"""Hand-worked cases for loss.py details that kill mutants other tests let survive (``make mutate``,
docs/MUTATION.md): the default KL estimator, error words, the KL importance weight per level and the
per-group statistics of lambda-GRPO's weights.
"""

import copy
import math
import re

import pytest
import torch

from grpokit.algo.loss import (
    _KEYWORDS,
    _param_fields,
    kl_estimate,
    lambda_weights,
    policy_loss,
)
from grpokit.algo.ratio import _turn_ratio, kl_weight


def test_kl_estimate_default_is_k3_and_bad_names_are_named():
    # d = ref - logp = 1: k3 = e - 1 - 1 = 0.718282 (k1 would be -1, k2 0.5)
    assert kl_estimate(torch.zeros(1, 1), torch.ones(1, 1)).item() == pytest.approx(math.e - 2)
    with pytest.raises(ValueError, match="^" + re.escape("unknown kl_estimator 'x'; valid: k1, k2, k3") + "$"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "x")


def test_policy_loss_and_turn_ratio_errors_name_what_is_missing():
    valid = ", ".join([*_KEYWORDS, *_param_fields()])  # the objectives' own parameters (sapo_tau_pos ...) last
    with pytest.raises(TypeError, match=re.escape(f"unexpected keyword argument 'nope'; valid: {valid}") + "$"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), nope=1)
    with pytest.raises(
        ValueError, match="^" + re.escape("ratio level 'turn' needs turn_ids_NT (the turn of every token)") + "$"
    ):
        _turn_ratio(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), None)


def test_kl_weight_per_level():
    # log ratios [0, 2] on a row with 2 real tokens and [1, 9] on a row with 1 real token
    lr, m = torch.tensor([[0.0, 2.0], [1.0, 9.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    z = torch.zeros(2, 2)
    # token: exp of each token's own log ratio
    assert torch.allclose(kl_weight(lr, z, m, "token"), lr.exp())
    # sequence: exp of the mean over real tokens: exp(1) and exp(1 / 1 token)
    assert torch.allclose(kl_weight(lr, z, m, "sequence"), torch.full((2, 2), math.e))
    # trajectory (TIC-GRPO): exp of the sum: exp(2) and exp(1)
    assert torch.allclose(kl_weight(lr, z, m, "trajectory"), torch.tensor([[math.e**2] * 2, [math.e] * 2]))


def test_lambda_weights_use_each_groups_own_mean_and_std():
    # group 1 lengths [1, 5]: mean 3, population std 2 -> z = -+1; group 2 [10, 30]: mean 20, std 10 -> z = -+1.
    # lambda 2, r 1/9: h = [8/9, 10/9], g = h^2 = [0.790123, 1.234568], f = 2 softmax(g)
    #   = [2 / (1 + e^0.444444), 2 e^0.444444 / (1 + e^0.444444)] = [0.781365, 1.218635] for both groups
    #   (a batch-wide mean 11.5 or std, or multiplying by the std, would give other h and, through the
    #   power, other weights; lambda 2 because a softmax alone ignores a common shift of h)
    f = lambda_weights(torch.tensor([1.0, 5.0, 10.0, 30.0]), 2, 2.0)
    assert torch.allclose(f, torch.tensor([0.781365, 1.218635, 0.781365, 1.218635]), atol=1e-5)
    # eps 1 is added to the std: z = -+2 / (2 + 1) = -+2/3, h = [1 - 2/27, 1 + 2/27], f = [0.926061, 1.073939]
    f = lambda_weights(torch.tensor([1.0, 5.0]), 2, 1.0, eps=1.0)
    assert torch.allclose(f, torch.tensor([0.926061, 1.073939]), atol=1e-5)


def test_turn_ratio_means_each_turn_in_float64_with_a_bool_mask():
    # log ratios (old 0): row 0 [1, 3] in turns 0, 1 -> [1, 3]; row 1 [1, 3] in one turn -> mean [2, 2];
    # row 2 [2, 4] both in turn 1 -> [3, 3]. Three rows, two tokens: the per-row sums have N rows, not T.
    logp = torch.tensor([[1.0, 3.0], [1.0, 3.0], [2.0, 4.0]], dtype=torch.float64)
    ids = torch.tensor([[0, 1], [0, 0], [1, 1]])
    out = _turn_ratio(logp, torch.zeros_like(logp), torch.ones(3, 2, dtype=torch.bool), ids)
    assert out.dtype == torch.float64 and out.tolist() == [[1.0, 3.0], [2.0, 2.0], [3.0, 3.0]]


def test_turn_ratio_of_zero_width_rows():
    # no token at all (T = 0): nothing to average, an empty (N, 0) result rather than an error
    assert _turn_ratio(torch.zeros(2, 0), torch.zeros(2, 0), torch.zeros(2, 0), torch.zeros(2, 0)).shape == (2, 0)


def test_learnable_lambda_optimizer_steps_skips_and_state():
    from grpokit.algo.lambda_grpo import LearnableLambda

    lam = LearnableLambda(0.5, lr=0.1, r=1 / 9)
    assert lam.optimizer.param_groups[0]["betas"] == (0.9, 0.99)  # not Adam's default 0.999
    # no gradient yet, then a NaN one: the step is skipped, lambda stays and the logged gradient is 0
    assert lam.step() == {"lambda_grpo/lambda": 0.5, "lambda_grpo/grad": 0.0}
    lam.param.grad = torch.tensor(float("nan"))
    assert lam.step() == {"lambda_grpo/lambda": 0.5, "lambda_grpo/grad": 0.0}
    # a gradient of 2 summed over ranks by dist.sync_grads: Adam's first step moves lambda by lr = 0.1 against it
    seen = []
    lam.zero_grad()
    assert lam.param.grad is None  # set to None, not zeroed
    lam.param.grad = torch.tensor(2.0)
    out = lam.step(dist=type("D", (), {"sync_grads": staticmethod(lambda ps: seen.append(ps))})())
    assert seen == [[lam.param]] and out["lambda_grpo/grad"] == 2.0
    assert out["lambda_grpo/lambda"] == pytest.approx(0.4, abs=1e-6)
    # the state restores lambda and Adam's moments: both copies take the same next step
    other = LearnableLambda(0.0, lr=0.1, r=1 / 9)
    other.load_state_dict(copy.deepcopy(lam.state_dict()))  # as a checkpoint file would; the live dict shares tensors
    assert other.param.item() == lam.param.item()
    for x in (lam, other):
        x.param.grad = torch.tensor(1.0)
        x.step()
    assert other.param.item() == lam.param.item() and other.optimizer.state_dict()["state"][0]["step"] == 2


def test_loss_setting_bounds_and_messages():
    from grpokit.algo.ratio import log_importance_ratio

    z, one = torch.zeros(1, 2), torch.ones(1, 2)
    adv = torch.ones(1)

    def run(**kw):
        return policy_loss(z, z, adv, one, **kw)[0]

    run(clip_low=0.0, clip_high=0.0, dual_clip=1.5)  # the edges that are valid: 0 and 0, dual_clip just above 1
    run(clip_high=-1.0, objective="cispo")  # CISPO's weight cap 1 + clip_high may go down to 0 (TRL's epsilon_high < 1)
    for kw, msg in (
        ({"clip_low": 1.0}, "clip_low must be in [0, 1), got 1.0"),
        ({"clip_high": -0.1}, "clip_high must be >= 0 with objective clip, got -0.1"),
        ({"clip_high": -1.01, "objective": "cispo"}, "clip_high must be >= -1 with objective cispo, got -1.01"),
        ({"dual_clip": 1.0}, "dual_clip must be > 1 (or None), got 1.0"),
        ({"beta": 0.1}, "beta > 0 needs ref_logp_NT (reference-policy logprobs)"),
        ({"entropy_coef": 0.1}, "entropy_coef != 0 needs entropy_NT"),
    ):
        with pytest.raises(ValueError, match="^" + re.escape(msg) + "$"):
            run(**kw)
    # default level "token": the per-token log ratio itself; unknown levels are named
    lr = log_importance_ratio(torch.tensor([[1.0, 3.0]]), torch.zeros(1, 2), one)
    assert lr.tolist() == [[1.0, 3.0]]
    with pytest.raises(ValueError, match="^" + re.escape("unknown ratio level 'x'; valid: ") + r"\w+(, \w+)+$"):
        log_importance_ratio(z, z, one, "x")


def test_kl_term_passes_estimator_and_clamp_and_reports_the_mean():
    # logp 0, ref 2 on two tokens: d = 2; k1 = -d = -2 per token, clamped to [-1, 1] -> -1; metric kl = mean = -1
    z, one = torch.zeros(1, 2), torch.ones(1, 2)
    _, m = policy_loss(
        z, z, torch.ones(1), one, beta=0.1, ref_logp_NT=torch.full((1, 2), 2.0), kl_estimator="k1", kl_clamp=1.0
    )
    assert m["kl"] == pytest.approx(-1.0)


def test_flat_groups_spread_equal_to_the_tolerance_is_flat():
    from grpokit.algo.advantages import flat_groups

    # [1, 2] with flat_rtol 0.5: spread 1 <= 0.5 * 2 = 1 -> flat (the bound is inclusive)
    assert flat_groups(torch.tensor([[1.0, 2.0]]), 0.5).tolist() == [True]


# ---------------------------------------------------------------- the last sitting's untriaged survivors


def test_kl_bias_weight_follows_the_ratio_level_and_spans_the_ratio_mask():
    from grpokit.algo.loss import policy_loss

    # one sequence of 2 tokens, log ratios [0.2, -0.4] (logp - old), ref = old; advantages 0 so only the KL counts
    logp = torch.tensor([[-1.0, -2.0]])
    old = torch.tensor([[-1.2, -1.6]])
    mask = torch.ones(1, 2)
    k3 = lambda lp, rf: torch.exp(rf - lp) - (rf - lp) - 1  # noqa: E731
    kl = k3(logp, old)
    common = dict(beta=1.0, kl_bias_correction=True, ref_logp_NT=old, aggregation="token-mean")
    # token level: each token's KL times its own ratio exp(0.2), exp(-0.4)
    tok, _ = policy_loss(logp, old, torch.zeros(1), mask, ratio_level="token", **common)
    assert tok.item() == pytest.approx(((kl * torch.exp(logp - old)).sum() / 2).item(), rel=1e-6)
    # sequence level: both tokens times the geometric mean exp((0.2 - 0.4) / 2) = exp(-0.1)
    seq, _ = policy_loss(logp, old, torch.zeros(1), mask, ratio_level="sequence", **common)
    assert seq.item() == pytest.approx((kl.sum() * math.exp(-0.1) / 2).item(), rel=1e-6)
    # a loss mask keeping token 0 only: the sequence weight still spans both tokens when ratio_mask says so
    from grpokit.algo.loss import objective_loss
    from grpokit.algo.settings import ClipSettings, KLSettings, LossSettings, LossTensors, Normalisers

    s = LossSettings(ClipSettings(ratio_level="sequence"), KLSettings(1.0, "k3", True))
    t = LossTensors(logp, old, torch.zeros(1), torch.tensor([[1.0, 0.0]]), ref_logp=old, ratio_mask=mask)
    got, _ = objective_loss(t, s, Normalisers("token-mean"))
    assert got.item() == pytest.approx((kl[0, 0] * math.exp(-0.1)).item(), rel=1e-6)  # exp(0.2) if only token 0


def test_aggregate_refuses_what_it_cannot_normalise_in_words():
    from grpokit.algo.loss import AGGREGATIONS, aggregate
    from grpokit.algo.ratio import RATIO_LEVELS, log_importance_ratio

    x, m = torch.ones(1, 2), torch.ones(1, 2)
    msg = "aggregation 'seq-mean-token-sum-norm' needs a positive norm_constant (e.g. max completion length)"
    for bad in (None, 0.0, -1.0):
        with pytest.raises(ValueError) as e:
            aggregate(x, m, "seq-mean-token-sum-norm", norm_constant=bad)
        assert str(e.value) == msg
    # C = 1 is valid: 2 tokens of loss 1 over (N = 1) * C = 1 -> 2
    assert aggregate(x, m, "seq-mean-token-sum-norm", norm_constant=1.0).item() == 2.0
    with pytest.raises(ValueError) as e:
        aggregate(x, m, "lambda-grpo")
    assert str(e.value) == "aggregation 'lambda-grpo' needs seq_weights_N, the per-sequence weights f_lambda (N,)"
    with pytest.raises(ValueError) as e:
        aggregate(x, m, "mean")
    assert str(e.value) == f"unknown aggregation 'mean'; valid: {', '.join(AGGREGATIONS)}"
    with pytest.raises(ValueError) as e:
        log_importance_ratio(x, x, m, "word")
    assert str(e.value) == f"unknown ratio level 'word'; valid: {', '.join(RATIO_LEVELS)}"
    # lambda-GRPO over one token: weight 3 times loss 1 divided by max(1 token, 1) = 3
    one = torch.tensor([[1.0, 0.0]])
    assert aggregate(torch.ones(1, 2), one, "lambda-grpo", seq_weights_N=torch.tensor([3.0])).item() == 3.0


def test_offpolicy_metric_is_zero_when_the_mask_is_off():
    from grpokit.algo.loss import policy_loss

    logp = torch.tensor([[-1.0, -1.0]])
    _, m = policy_loss(logp, logp - 1.0, torch.tensor([-1.0]), torch.ones(1, 2))
    assert m["offpolicy/masked_sequences"] == 0.0
    # on: the row drifted by mean(old - logp) = -1 < delta, so still nothing is masked; drift +1 > 0.5 masks it
    _, m = policy_loss(logp, logp + 1.0, torch.tensor([-1.0]), torch.ones(1, 2), offpolicy_delta=0.5)
    assert m["offpolicy/masked_sequences"] == 1.0


def test_import_paths_split_at_the_first_colon():
    from grpokit.algo import registry

    assert registry.is_import_path("pkg:a:b")
    assert registry.is_import_path("pkg::b")  # module "pkg", attribute ":b": both parts non-empty
    with pytest.raises(ValueError) as e:
        registry.lookup("token mask", "math:pi:x")  # module math, attribute "pi:x": not a module "math:pi"
    assert str(e.value).startswith(
        "token mask 'math:pi:x' could not be imported (module 'math' has no attribute 'pi:x')"
    )
