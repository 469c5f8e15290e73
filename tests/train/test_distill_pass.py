"""The top-k distillation passes (train/distill_pass.py) equal one plain forward's full logits: the
teacher's top-k and sampled-token log-probabilities, the student's log-probabilities of those ids and
their gradients, with blocks of a few positions (the chunking must change nothing)."""

import pytest
import torch

from grpokit.train import distill_pass
from grpokit.train.token_batch import make_token_batch
from helpers.models import tiny_llama


def _batch():
    from grpokit.types import Rollout

    prompts = [[1, 5, 6, 7], [1, 9]]
    comps = [[5, 6, 2], [7], [8, 9, 10, 2], [3, 4]]
    return make_token_batch(Rollout(prompts, comps, [[0.0] * len(c) for c in comps], ["length"] * 4, 2), 0)


def _plain(model, batch, temperature):
    T = batch.width
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    return torch.log_softmax(logits.logits[:, -T - 1 : -1].float() / temperature, -1)  # (N, T, V)


def test_passes_equal_a_plain_forward(monkeypatch):
    monkeypatch.setattr(distill_pass, "LOGITS_CHUNK_ELEMENTS", 3 * 64)  # blocks of a few positions
    torch.manual_seed(0)
    teacher, student, batch = tiny_llama(), tiny_llama(), _batch()
    torch.nn.init.normal_(teacher.get_output_embeddings().weight)  # another distribution than the student's
    m = batch.completion_mask.bool()
    logp, top = distill_pass.teacher_top_k(teacher, batch, 3, 0.7, coef=0.5, rows=1)
    with torch.no_grad():
        full_t = _plain(teacher, batch, 0.7)
    want = full_t.topk(3, dim=-1)
    assert torch.equal(top.ids[m], want.indices[m]) and top.coef == 0.5
    assert torch.allclose(top.logp[m], want.values[m], atol=1e-5)
    assert torch.allclose(logp[m], full_t.gather(-1, batch.completion_ids[..., None])[..., 0][m], atol=1e-5)

    lp, ent, s_top = distill_pass.student_logprobs(student, batch, top.ids, 0.7, entropy_grad=False)
    (s_top.sum(-1) * batch.completion_mask).sum().backward()
    ours = [p.grad.clone() for p in student.parameters()]
    student.zero_grad()
    full_s = _plain(student, batch, 0.7)
    (full_s.gather(-1, top.ids).sum(-1) * batch.completion_mask).sum().backward()
    assert torch.allclose(s_top[m], full_s.gather(-1, top.ids)[m].detach(), atol=1e-5)
    assert torch.allclose(lp[m], full_s.gather(-1, batch.completion_ids[..., None])[..., 0][m].detach(), atol=1e-5)
    assert torch.allclose(ent[m], -(full_s.exp() * full_s).sum(-1)[m].detach(), atol=1e-5)
    for a, b in zip(ours, (p.grad for p in student.parameters())):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_forward_kl_term_adds_up_over_micro_batches():
    """One update with the top-k term: micro-batches of one row give the whole batch's gradient and
    loss, and with zero advantages the loss is the term alone, coef * the token mean of the KL."""
    import copy

    from grpokit.algo.distill import forward_kl_top_k
    from grpokit.algo.pipeline import UpdateInputs, loss_settings
    from grpokit.config.sections import AlgoConfig, OptimConfig
    from grpokit.train.update import Accumulator, Forwards, accumulate, make_optimizer

    torch.manual_seed(0)
    teacher, student, batch = tiny_llama(), tiny_llama(seed=3), _batch()
    _, top = distill_pass.teacher_top_k(teacher, batch, 4, 1.0, coef=0.5)
    with torch.no_grad():
        kl = forward_kl_top_k(top.logp, _plain(student, batch, 1.0).gather(-1, top.ids))
    m = batch.completion_mask
    want = 0.5 * float((kl * m).sum() / m.sum())  # token-mean: coef * sum KL / loss tokens
    assert want > 1e-3  # two different models
    losses, grads = [], []
    for rows in (0, 1):
        model = copy.deepcopy(student)
        opt, _ = make_optimizer(model, OptimConfig(lr=0.0), 1)
        loss, norms = loss_settings(AlgoConfig(aggregation="token-mean"))
        inputs = UpdateInputs(batch, torch.zeros(4), m, None, None, loss=loss, norms=norms, teacher_top_k=top)
        acc = Accumulator()
        accumulate(model, opt, inputs, acc, Forwards(micro_batch_size=rows))
        losses.append(acc.loss)
        grads.append([p.grad.clone() for p in model.parameters()])
        assert acc.sums["distill/forward_kl"] / acc.tokens == pytest.approx(float((kl * m).sum() / m.sum()), rel=1e-4)
    assert losses[0] == pytest.approx(want, rel=1e-4) and losses[1] == pytest.approx(want, rel=1e-4)
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)
