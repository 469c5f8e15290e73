"""Chunked, length-bucketed completion logprobs equal one plain forward (values and gradients)."""

import torch

from grpokit.logprobs import completion_logprobs, make_token_batch, plan_buckets
from grpokit.types import Rollout


def _rollout():
    # 3 prompts of lengths 4, 2, 3; G = 2; completion lengths 1 .. 9 so buckets trim both sides
    prompts = [[1, 5, 6, 7], [1, 9], [1, 3, 4]]
    comps = [[5] * 9, [6, 2], [7, 8, 9, 2], [3], [4] * 8, [10, 11, 2]]
    return Rollout(prompts, comps, [[0.0] * len(c) for c in comps], ["length"] * 6, 2)


def _plain(model, batch):
    """Reference: the full (N, L, V) logits of one forward, log-softmax, gather."""
    T = batch.width
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids).logits
    return torch.log_softmax(logits[:, -T - 1:-1].float(), -1).gather(-1, batch.completion_ids[..., None])[..., 0]


def test_plan_buckets_hand_example():
    # lengths [30, 2, 32, 3]: k=1 costs 4*32 + 4*4 = 144, k=2 costs (2*3 + 2*32) + 2*16 = 102, k=4 costs 67 + 64 = 131
    groups = plan_buckets([30, 2, 32, 3])
    assert [g.tolist() for g in groups] == [[1, 3], [0, 2]]
    assert [g.tolist() for g in plan_buckets([30, 2, 32, 3], buckets=4)] == [[1], [3], [0], [2]]
    assert [g.tolist() for g in plan_buckets([5, 5, 5, 5])] == [[0, 1, 2, 3]]  # equal lengths: one group


def test_bucketed_logprobs_and_grads_equal_a_plain_forward(tiny_model):
    batch = make_token_batch(_rollout(), pad_token_id=0)
    m = batch.completion_mask
    for buckets in (1, 2, 3, None):
        tiny_model.zero_grad()
        lp, ent = completion_logprobs(tiny_model, batch, buckets=buckets, chunk_size=4, with_entropy=True)
        (lp * m).sum().backward()
        g_ours = [p.grad.clone() for p in tiny_model.parameters()]
        tiny_model.zero_grad()
        ref = _plain(tiny_model, batch)
        (ref * m).sum().backward()
        assert torch.allclose(lp * m, ref * m, atol=1e-5)
        assert ent.shape == lp.shape and (ent[m.bool()] > 0).all()
        for a, b in zip(g_ours, (p.grad for p in tiny_model.parameters())):
            assert torch.allclose(a, b, atol=1e-5)


def test_memory_flat_head_matches_autograd_with_temperature_and_tiny_chunks(tiny_model, monkeypatch):
    import grpokit.logprobs as L

    batch = make_token_batch(_rollout(), pad_token_id=0)
    m = batch.completion_mask
    monkeypatch.setattr(L, "LOGITS_CHUNK_ELEMENTS", 40)  # forces 1-position checkpointed chunks
    monkeypatch.setattr(L, "SMALL_LOGITS_ELEMENTS", 0)  # ... even though these logits are tiny
    tiny_model.zero_grad()
    lp, _ = completion_logprobs(tiny_model, batch, temperature=0.7, buckets=1)
    (lp * m * torch.arange(1.0, 10.0)[: lp.shape[1]]).sum().backward()  # non-uniform upstream gradient
    g_ours = [p.grad.clone() for p in tiny_model.parameters()]
    tiny_model.zero_grad()
    T = batch.width
    logits = tiny_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids).logits
    ref = torch.log_softmax(logits[:, -T - 1:-1] / 0.7, -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    (ref * m * torch.arange(1.0, 10.0)[: T]).sum().backward()
    assert torch.allclose(lp * m, ref * m, atol=1e-5)
    for a, b in zip(g_ours, (p.grad for p in tiny_model.parameters())):
        assert torch.allclose(a, b, atol=1e-5)


def test_small_logits_skip_checkpointing_with_identical_values_and_grads(tiny_model, monkeypatch):
    # N*T*V here is a few hundred floats, under SMALL_LOGITS_ELEMENTS: autograd keeps the logits and
    # nothing is recomputed; the ops are the same, so values and gradients equal the checkpointed path's
    import grpokit.logprobs as L

    batch = make_token_batch(_rollout(), pad_token_id=0)
    m = batch.completion_mask

    def run():
        tiny_model.zero_grad()
        lp, ent = completion_logprobs(tiny_model, batch, temperature=0.7, with_entropy=True, buckets=1)
        (lp * m).sum().backward()
        return lp.detach(), ent, [p.grad.clone() for p in tiny_model.parameters()]

    calls = []
    monkeypatch.setattr(L, "checkpoint", lambda *a, **k: calls.append(1) or torch.utils.checkpoint.checkpoint(*a, **k))
    plain = run()
    assert calls == []  # the small batch took the plain path
    monkeypatch.setattr(L, "SMALL_LOGITS_ELEMENTS", 0)
    ckpt = run()
    assert calls  # and this one the checkpointed path
    assert torch.equal(plain[0], ckpt[0]) and torch.equal(plain[1], ckpt[1])
    assert all(torch.equal(a, b) for a, b in zip(plain[2], ckpt[2]))
