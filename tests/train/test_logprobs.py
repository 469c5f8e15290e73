"""Chunked, length-bucketed completion logprobs equal one plain forward (values and gradients)."""

import torch

import grpokit.train.hidden_states as hidden_states
from grpokit.train.logprobs import completion_logprobs, plan_buckets
from grpokit.train.token_batch import make_token_batch
from grpokit.types import Rollout
from helpers.models import tiny_causal_lm


def _rollout():
    # 3 prompts of lengths 4, 2, 3; G = 2; completion lengths 1 .. 9 so buckets trim both sides
    prompts = [[1, 5, 6, 7], [1, 9], [1, 3, 4]]
    comps = [[5] * 9, [6, 2], [7, 8, 9, 2], [3], [4] * 8, [10, 11, 2]]
    return Rollout(prompts, comps, [[0.0] * len(c) for c in comps], ["length"] * 6, 2)


def _plain(model, batch):
    """Reference: the full (N, L, V) logits of one forward, log-softmax, gather."""
    T = batch.width
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits
    return torch.log_softmax(logits[:, -T - 1 : -1].float(), -1).gather(-1, batch.completion_ids[..., None])[..., 0]


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
    import grpokit.train.logprobs as L

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
    logits = tiny_model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits
    ref = torch.log_softmax(logits[:, -T - 1 : -1] / 0.7, -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    (ref * m * torch.arange(1.0, 10.0)[:T]).sum().backward()
    assert torch.allclose(lp * m, ref * m, atol=1e-5)
    for a, b in zip(g_ours, (p.grad for p in tiny_model.parameters())):
        assert torch.allclose(a, b, atol=1e-5)


def test_small_logits_skip_checkpointing_with_identical_values_and_grads(tiny_model, monkeypatch):
    # N*T*V here is a few hundred floats, under SMALL_LOGITS_ELEMENTS: autograd keeps the logits and
    # nothing is recomputed; the ops are the same, so values and gradients equal the checkpointed path's
    import grpokit.train.logprobs as L

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


def _tokens_through_backbone(model, fn):
    """Run ``fn`` and count the token positions the model's embedding layer sees."""
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, a, out: seen.append(a[0].numel()))
    try:
        fn()
    finally:
        hook.remove()
    return sum(seen)


def test_shared_prompts_run_once_per_prompt_with_plain_forward_values_and_grads(tiny_model, monkeypatch):

    batch = make_token_batch(_rollout(), pad_token_id=0)
    m = batch.completion_mask
    for model in (tiny_model, tiny_causal_lm(16, arch="qwen2", seed=1, max_positions=64, tie_word_embeddings=True)):
        grads = {}
        for share in (True, False):
            monkeypatch.setattr(hidden_states, "PROMPT_SHARING_TYPES", ("llama", "qwen2") if share else ())
            model.zero_grad()
            box = {}
            n = _tokens_through_backbone(model, lambda: box.update(lp=completion_logprobs(model, batch, buckets=1)[0]))
            (box["lp"] * m).sum().backward()
            grads[share] = [p.grad.clone() for p in model.parameters()]
            # 3 distinct prompts of width 4 once + 6 completions of width 9, against 6 rows of width 13
            assert n == (3 * 4 + 6 * 9 if share else 6 * 13)
            ref = _plain(model, batch)
            assert torch.allclose(box["lp"] * m, ref * m, atol=1e-5)
        for a, b in zip(grads[True], grads[False]):
            assert torch.allclose(a, b, atol=1e-5)


def test_prompt_sharing_is_skipped_when_no_prompt_repeats_or_under_activation_checkpointing(tiny_model):
    from grpokit.train.hidden_states import can_share_prompts, shared_prompts

    distinct = Rollout([[1, 5], [1, 6, 7]], [[3, 4], [5]], [[0.0, 0.0], [0.0]], ["length"] * 2, 1)
    assert shared_prompts(make_token_batch(distinct, pad_token_id=0)) is None
    first, inverse = shared_prompts(make_token_batch(_rollout(), pad_token_id=0))
    assert sorted(first.tolist()) == [0, 2, 4] and inverse[first].tolist() == [0, 1, 2]  # one first row each
    assert inverse.tolist()[0::2] == inverse.tolist()[1::2]  # G = 2 rows per prompt share one entry
    assert can_share_prompts(tiny_model, tiny_model.get_decoder())
    on = getattr(tiny_model, "activation_checkpointing_enable", None) or tiny_model.gradient_checkpointing_enable
    off = getattr(tiny_model, "activation_checkpointing_disable", None) or tiny_model.gradient_checkpointing_disable
    on()
    try:
        assert not can_share_prompts(tiny_model, tiny_model.get_decoder())
    finally:
        off()
