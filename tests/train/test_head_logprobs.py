"""train/head.py: the output layer + log-softmax + target pick as one function with its own backward."""

import math

import pytest
import torch

import grpokit.train.head as H
import grpokit.train.logprobs as L
from grpokit.train.logprobs import completion_logprobs
from grpokit.train.token_batch import make_token_batch
from grpokit.types import Rollout


def _reference(h, weight, bias, targets, temperature):
    z = torch.nn.functional.linear(h, weight, bias) / temperature
    return torch.log_softmax(z, -1).gather(1, targets[:, None])[:, 0]


def test_hand_example_value_and_gradients():
    # V = 2, hidden 1: W = [[1], [0]], h = ln 3 -> logits (ln 3, 0), p = (3/4, 1/4)
    h = torch.tensor([[math.log(3.0)]], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([[1.0], [0.0]], dtype=torch.float64, requires_grad=True)
    head = torch.nn.Linear(1, 2, bias=False).double()
    head.weight = torch.nn.Parameter(w)
    logp, ent = H.head_logprobs(head, h, torch.tensor([0]), chunk=1, temperature=1.0, with_entropy=True)
    assert logp.item() == pytest.approx(math.log(0.75), abs=1e-15)
    # entropy of (3/4, 1/4) = -(3/4 ln 3/4 + 1/4 ln 1/4)
    assert ent.item() == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), abs=1e-15)
    logp.sum().backward()
    # d logp / dz = (1 - 3/4, -1/4); dz0/dh = 1, dz1/dh = 0 -> dh = 1/4; dW = dz^T h = (ln3/4, -ln3/4)
    assert h.grad.item() == pytest.approx(0.25, abs=1e-15)
    assert head.weight.grad[:, 0].tolist() == pytest.approx([math.log(3.0) / 4, -math.log(3.0) / 4], abs=1e-15)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_equal_autograd_in_float64(temperature, bias):
    g = torch.Generator().manual_seed(0)
    K, D, V = 11, 5, 13
    h = torch.randn(K, D, generator=g, dtype=torch.float64, requires_grad=True)
    head = torch.nn.Linear(D, V, bias=bias).double()
    targets = torch.randint(0, V, (K,), generator=g)
    up = torch.randn(K, generator=g, dtype=torch.float64)  # a non-uniform upstream gradient
    lp, ent = H.head_logprobs(head, h, targets, chunk=3, temperature=temperature, with_entropy=False)
    assert ent is None
    (lp * up).sum().backward()
    ours = [h.grad.clone()] + [p.grad.clone() for p in head.parameters()]
    h.grad = None
    head.zero_grad()
    ref = _reference(h, head.weight, head.bias, targets, temperature)
    (ref * up).sum().backward()
    assert torch.allclose(lp, ref, atol=1e-12, rtol=0)
    for a, b in zip(ours, [h.grad] + [p.grad for p in head.parameters()]):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)


def test_gradcheck():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 7, (5,), generator=g)
    fn = lambda h, w, b: H.HeadLogprobs.apply(h, w, b, t, 0.8, 2, False, False)[0]
    assert torch.autograd.gradcheck(fn, (h, w, b))


def test_entropy_equals_the_full_distributions():
    g = torch.Generator().manual_seed(2)
    h = torch.randn(6, 4, generator=g, dtype=torch.float64)
    head = torch.nn.Linear(4, 9).double()
    _, ent = H.head_logprobs(head, h, torch.zeros(6, dtype=torch.long), chunk=4, temperature=0.5, with_entropy=True)
    logp = torch.log_softmax(head(h) / 0.5, -1)
    assert torch.allclose(ent, -(logp.exp() * logp).sum(-1), atol=1e-12, rtol=0)


def test_bfloat16_weights_agree_with_the_autograd_path():
    # the same roundings as autograd's path: bf16 logits, float32 log-softmax, bf16 gradients into the matmuls
    g = torch.Generator().manual_seed(3)
    h = torch.randn(40, 16, generator=g).bfloat16().requires_grad_()
    head = torch.nn.Linear(16, 50, bias=False).bfloat16()
    t = torch.randint(0, 50, (40,), generator=g)
    up = torch.randn(40, generator=g)
    lp, _ = H.head_logprobs(head, h, t, chunk=16, temperature=1.0, with_entropy=False)
    assert lp.dtype == torch.float32
    (lp * up).sum().backward()
    ours = h.grad.float().clone(), head.weight.grad.float().clone()
    h.grad = None
    head.zero_grad()
    ref = torch.log_softmax(head(h).float(), -1).gather(1, t[:, None])[:, 0]
    (ref * up).sum().backward()
    assert torch.allclose(lp, ref, atol=1e-5)
    assert torch.allclose(ours[0], h.grad.float(), atol=2e-2, rtol=2e-2)
    assert torch.allclose(ours[1], head.weight.grad.float(), atol=5e-2, rtol=2e-2)


def test_which_heads_are_fused(monkeypatch):
    h = torch.zeros(2, 4)
    lin = torch.nn.Linear(4, 3)
    assert not H.fusable(lin, h)  # CPU is not among FUSED_DEVICES by default
    monkeypatch.setattr(H, "FUSED_DEVICES", ("cpu",))
    assert H.fusable(lin, h)

    class Sub(torch.nn.Linear):  # quantised and adapter layers are subclasses with their own forward
        pass

    assert not H.fusable(Sub(4, 3), h)
    hooked = torch.nn.Linear(4, 3)
    hooked.register_forward_hook(lambda *a: None)
    assert not H.fusable(hooked, h)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not H.fusable(lin, h)


def _rollout():
    prompts = [[1, 5, 6, 7], [1, 9], [1, 3, 4]]
    comps = [[5] * 9, [6, 2], [7, 8, 9, 2], [3], [4] * 8, [10, 11, 2]]
    return Rollout(prompts, comps, [[0.0] * len(c) for c in comps], ["length"] * 6, 2)


@pytest.mark.parametrize("packed", [False, True])
def test_completion_logprobs_fused_equals_the_autograd_path(tiny_model, monkeypatch, packed):
    model = tiny_model.double()
    batch = make_token_batch(_rollout(), pad_token_id=0)
    m = batch.completion_mask.double()
    monkeypatch.setattr(L, "SMALL_LOGITS_ELEMENTS", 0)  # the autograd side checkpoints its chunks
    monkeypatch.setattr(L, "LOGITS_CHUNK_ELEMENTS", 3 * model.config.vocab_size)  # 3 positions a chunk

    def run():
        model.zero_grad()
        lp, ent = completion_logprobs(model, batch, temperature=0.7, with_entropy=True, packed=packed)
        (lp * m * torch.arange(1.0, 10.0, dtype=torch.float64)[: lp.shape[1]]).sum().backward()
        return lp.detach() * m, ent * m, [p.grad.clone() for p in model.parameters()]

    calls = []
    monkeypatch.setattr(H.HeadLogprobs, "apply", lambda *a, _f=H.HeadLogprobs.apply: calls.append(1) or _f(*a))
    plain = run()
    assert calls == []
    monkeypatch.setattr(H, "FUSED_DEVICES", ("cpu",))
    fused = run()
    assert calls
    assert torch.allclose(plain[0], fused[0], atol=1e-12, rtol=0)
    assert torch.allclose(plain[1], fused[1], atol=1e-12, rtol=0)
    for a, b in zip(plain[2], fused[2]):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)


def test_an_fsdp2_sharded_head_keeps_the_autograd_path(monkeypatch, tmp_path):
    """FSDP2 shards a parameter as a DTensor; the fused function's plain matmuls would take the local
    shard for the weight, so such a head is not fusable (its weight's type is not a plain Parameter)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    monkeypatch.setattr(H, "FUSED_DEVICES", ("cpu",))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/init", rank=0, world_size=1)
    try:
        head = torch.nn.Linear(4, 3)
        fully_shard(torch.nn.Sequential(head))
        assert type(head.weight).__name__ == "DTensor"
        assert not H.fusable(head, torch.zeros(2, 4))
    finally:
        dist.destroy_process_group()
