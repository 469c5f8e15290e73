"""lambda-GRPO (arXiv 2510.06870): hand-worked weights and lambda gradient, the GRPO / DAPO special
cases, micro-batching, and resume (lambda continues exactly where it was)."""

import json
import math

import pytest
import torch

from grpokit.algo.lambda_grpo import LearnableLambda
from grpokit.algo.loss import aggregate, lambda_weights, policy_loss
from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.train import Trainer
from helpers.runs import killed_copy


def test_lambda_weights_hand_worked():
    # one group, lengths 1 and 3: mean 2, population std 1 -> z = -1, +1; r = 0.5 -> h = 0.5, 1.5
    # lambda = 1: softmax(0.5, 1.5) = (1, e) / (1 + e) = 0.268941, 0.731059; times G = 2 -> 0.537883, 1.462117
    # lambda = 2: h^2 = 0.25, 2.25: softmax = (1, e^2) / (1 + e^2) = 0.119203, 0.880797 -> 0.238406, 1.761594
    # lambda = 0: h^0 = 1, 1 -> f = 1, 1 (DAPO's token-mean)
    L = torch.tensor([1, 3])
    assert lambda_weights(L, 2, 1.0, r=0.5).tolist() == pytest.approx([0.537883, 1.462117], abs=1e-5)
    assert lambda_weights(L, 2, 2.0, r=0.5).tolist() == pytest.approx([0.238406, 1.761594], abs=1e-5)
    assert lambda_weights(L, 2, 0.0, r=0.5).tolist() == pytest.approx([1.0, 1.0])
    # negative lambda moves weight to the short completion (GRPO's direction): lambda = -2 -> h^-2 = 4, 0.4444
    # softmax -> e^4 / (e^4 + e^0.4444) = 54.59815 / (54.59815 + 1.559623) = 0.972228 -> f = 1.944456, 0.055544
    assert lambda_weights(L, 2, -2.0, r=0.5).tolist() == pytest.approx([1.944456, 0.055544], abs=1e-5)
    # equal lengths: z = 0, h = 1 -> f = 1 for any lambda
    assert lambda_weights(torch.tensor([4, 4, 4]), 3, 5.0).tolist() == pytest.approx([1.0, 1.0, 1.0])


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    loss_NT = torch.randn(6, 5, generator=g)
    mask = torch.zeros(6, 5)
    for i, n in enumerate([1, 5, 3, 2, 4, 4]):  # two groups of 3 with varied lengths
        mask[i, :n] = 1
    return loss_NT, mask


def test_lambda_zero_is_dapo_token_mean_exactly():
    loss_NT, mask = _batch()
    f = lambda_weights(mask.sum(1), 3, 0.0)
    assert aggregate(loss_NT, mask, "lambda-grpo", seq_weights_N=f).item() == pytest.approx(
        aggregate(loss_NT, mask, "token-mean").item(), abs=1e-7
    )


def test_unified_form_contains_grpo_and_equal_lengths_make_every_lambda_grpo():
    # the unified loss 1/sum|o| sum_i f_i sum_t l with f_i = sum_j|o_j| / (N |o_i|) is GRPO's
    # seq-mean-token-mean exactly; the lambda family reaches it only when lengths are equal (then f = 1
    # for every lambda and GRPO = DAPO): lambda-GRPO interpolates around DAPO, not through GRPO
    loss_NT, mask = _batch(1)
    L = mask.sum(1)
    f_grpo = L.sum() / (len(L) * L)
    assert aggregate(loss_NT, mask, "lambda-grpo", seq_weights_N=f_grpo).item() == pytest.approx(
        aggregate(loss_NT, mask, "seq-mean-token-mean").item(), abs=1e-6
    )
    eq = torch.ones(6, 5)
    for lam in (-3.0, 0.0, 2.5):
        f = lambda_weights(eq.sum(1), 3, lam)
        v = aggregate(loss_NT, eq, "lambda-grpo", seq_weights_N=f).item()
        assert v == pytest.approx(aggregate(loss_NT, eq, "seq-mean-token-mean").item(), abs=1e-6)
        assert v == pytest.approx(aggregate(loss_NT, eq, "token-mean").item(), abs=1e-6)


def test_lambda_gradient_and_first_adam_step_hand_worked():
    # one group, lengths 1 and 3, token losses: row 0 [2], row 1 [1, 1, 1] -> sums S = 2, 3; 4 tokens
    # L(lambda) = (2 f_0 + 3 f_1) / 4, f = 2 softmax(h^lambda), h = 0.5, 1.5 (r = 0.5)
    # at lambda = 0: dg/dlambda = ln h = -0.693147, 0.405465; softmax 0.5, 0.5; their mean -0.143841
    # df_0 = 2 * 0.5 * (-0.693147 + 0.143841) = -0.549306, df_1 = +0.549306
    # dL/dlambda = (2 * -0.549306 + 3 * 0.549306) / 4 = 0.137327
    lam = LearnableLambda(0.0, lr=0.01, r=0.5)
    loss_NT = torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    f = lam.weight_fn(mask.sum(1), 2)(slice(0, 2))
    aggregate(loss_NT, mask, "lambda-grpo", seq_weights_N=f).backward()
    assert lam.param.grad.item() == pytest.approx(0.137327, abs=1e-5)
    # Adam's first step is -lr * m^/(sqrt(v^) + eps) = -lr * g/|g| = -0.01
    m = lam.step()
    assert m["lambda_grpo/lambda"] == pytest.approx(-0.01, abs=1e-6) and m["lambda_grpo/grad"] == pytest.approx(
        0.137327, abs=1e-5
    )


def test_lambda_micro_batches_add_up_to_the_batch():
    # the weights depend only on lengths and lambda: micro-batches with the batch's token count sum to the batch
    g = torch.Generator().manual_seed(3)
    logp = torch.randn(6, 5, generator=g)
    old = logp + 0.1 * torch.randn(6, 5, generator=g)
    adv = torch.randn(6, generator=g)
    _, mask = _batch()
    n_tok = float(mask.sum())

    def run(parts):
        lam = LearnableLambda(0.7, lr=0.01, r=1 / 9)
        x = logp.clone().requires_grad_(True)
        fn = lam.weight_fn(mask.sum(1), 3)
        for rows in parts:
            loss, _ = policy_loss(
                x[rows],
                old[rows],
                adv[rows],
                mask[rows],
                aggregation="lambda-grpo",
                num_tokens=n_tok,
                num_sequences=6.0,
                seq_weights_N=fn(rows),
            )
            loss.backward()
        return x.grad, lam.param.grad

    gx, gl = run([slice(0, 6)])
    gx2, gl2 = run([slice(0, 2), slice(2, 3), slice(3, 6)])
    assert torch.allclose(gx, gx2, atol=1e-6) and gl.item() == pytest.approx(gl2.item(), abs=1e-6)


def likes_a(prompts, completions, **kwargs):
    return [min(1.0, c.count("a") / 3) for c in completions]


ROWS = [{"prompt": p, "answer": "a"} for p in ("ab", "cd", "ef", "gh", "ij", "12")]


def _cfg(model_dir, out):
    return apply_overrides(
        Config(),
        [
            f"model.name_or_path={model_dir}",
            "data.task=",
            "data.eval_size=0",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "algo.aggregation=lambda-grpo",
            "algo.lambda_lr=0.05",
            "algo.num_iterations=2",
            "optim.lr=0.01",
            "train.steps=4",
            "train.prompts_per_step=2",
            "train.save_every=2",
            "train.keep_checkpoints=3",
            "train.threads=1",
            "train.deterministic=true",
            "record.sinks=[]",
            "record.report=false",
            f"train.out={out}",
        ],
    )


def _lambdas(run):
    return [json.loads(l)["lambda_grpo/lambda"] for l in (run / "metrics.jsonl").read_text().splitlines()]


def test_lambda_is_logged_checkpointed_and_resumed_exactly(tiny_model_dir, tmp_path):
    ref = tmp_path / "ref"
    Trainer(_cfg(tiny_model_dir, ref), reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True).train()
    lam_ref = _lambdas(ref)
    assert len(lam_ref) == 4 and len(set(lam_ref)) == 4, "lambda should move every step"
    saved = torch.load(ref / "checkpoints" / "step-000004" / "extra_state.pt", weights_only=False)["lambda_grpo"]
    assert saved["lambda"].item() == pytest.approx(lam_ref[-1], abs=0, rel=0)
    # "kill" after step 2: keep that checkpoint and the first two metric lines, then resume
    res = killed_copy(ref, tmp_path / "res")
    Trainer(
        _cfg(tiny_model_dir, res), reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True, resume=res
    ).train()
    assert _lambdas(res) == lam_ref  # bit-exact: lambda and its Adam moments were restored
    resumed = torch.load(res / "checkpoints" / "step-000004" / "extra_state.pt", weights_only=False)["lambda_grpo"]
    assert torch.equal(resumed["lambda"], saved["lambda"])
    assert math.isfinite(lam_ref[-1])
