"""The forward KL on the teacher's top-k (algo/distill.py): by hand, its float64 gradient, and k = V
against TRL's GKD forward KL (generalized_jsd_loss with beta=0) as an oracle."""

import math

import pytest
import torch

from grpokit.algo.distill import TeacherTopK, forward_kl_loss, forward_kl_top_k
from grpokit.algo.settings import Normalisers


def hand_case():
    """Three tokens, k = 2. Position 0: teacher p_T = [0.5, 0.3, 0.2], top-2 ids [0, 1]; student
    p_S = [0.25, 0.25, 0.5]. KL_top2 = 0.5 ln(0.5/0.25) + 0.3 ln(0.3/0.25) = 0.5 ln 2 + 0.3 ln 1.2
    = 0.346574 + 0.054696 = 0.401270 (token 2, the teacher's 0.2, is left out: not renormalised).
    Position 1: teacher = student = [0.6, 0.3, 0.1], top-2 ids [0, 1]: KL 0."""
    p_t = torch.tensor([[[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]]], dtype=torch.float64)
    p_s = torch.tensor([[[0.25, 0.25, 0.5], [0.6, 0.3, 0.1]]], dtype=torch.float64)
    top = p_t.log().topk(2, dim=-1)
    return top, p_s.log()


def test_forward_kl_top_k_by_hand():
    top, logp_s = hand_case()
    assert top.indices.tolist() == [[[0, 1], [0, 1]]]
    student = logp_s.gather(-1, top.indices).requires_grad_(True)
    kl = forward_kl_top_k(top.values, student)
    want = 0.5 * math.log(2) + 0.3 * math.log(1.2)
    assert kl.tolist()[0] == pytest.approx([want, 0.0], abs=1e-12)
    assert want == pytest.approx(0.401270, abs=1e-6)
    kl.sum().backward()
    # d KL / d log p_S(v) = -p_T(v): [-0.5, -0.3] and [-0.6, -0.3]
    assert student.grad.flatten().tolist() == pytest.approx([-0.5, -0.3, -0.6, -0.3])


def test_the_loss_term_is_reduced_like_the_policy_loss():
    top, logp_s = hand_case()
    term = TeacherTopK(ids=top.indices, logp=top.values, coef=2.0)
    student = logp_s.gather(-1, top.indices)
    want = 0.5 * math.log(2) + 0.3 * math.log(1.2)
    mask = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    # token-mean over 2 tokens: coef * (0.401270 + 0) / 2 = 0.401270
    loss, sums = forward_kl_loss(term, student, mask, Normalisers("token-mean", num_sequences=1, num_tokens=2))
    assert float(loss) == pytest.approx(want)
    assert sums["distill/forward_kl"] == pytest.approx(want)
    assert sums["distill/top_k_mass"] == pytest.approx(0.8 + 0.9)  # the teacher's mass on its top-2
    # a masked position adds nothing; seq-mean-token-mean over 1 sequence of 1 token: coef * 0.401270
    loss, sums = forward_kl_loss(term, student, torch.tensor([[1.0, 0.0]]), Normalisers(num_sequences=1))
    assert float(loss) == pytest.approx(2 * want) and sums["distill/top_k_mass"] == pytest.approx(0.8)


def test_gradient_check_float64():
    torch.manual_seed(0)
    teacher = torch.log_softmax(torch.randn(2, 3, 5, dtype=torch.float64), -1).topk(3, dim=-1)

    def f(student_logits):
        return forward_kl_top_k(teacher.values, torch.log_softmax(student_logits, -1).gather(-1, teacher.indices))

    assert torch.autograd.gradcheck(f, (torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True),))


def test_k_equal_to_the_vocabulary_is_gkd_forward_kl():
    from trl.experimental.gkd import GKDTrainer

    torch.manual_seed(1)
    s_logits, t_logits = torch.randn(2, 4, 7, dtype=torch.float64), torch.randn(2, 4, 7, dtype=torch.float64)
    labels = torch.tensor([[1, 2, 3, -100], [4, 5, -100, -100]])
    mask = (labels != -100).double()
    top = torch.log_softmax(t_logits, -1).topk(7, dim=-1)
    term = TeacherTopK(ids=top.indices, logp=top.values, coef=1.0)
    ours, _ = forward_kl_loss(
        term, torch.log_softmax(s_logits, -1).gather(-1, top.indices), mask, Normalisers("token-mean", num_tokens=5)
    )
    theirs = GKDTrainer.generalized_jsd_loss(s_logits, t_logits, labels=labels, beta=0.0, num_items_in_batch=5)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-10)
