"""The static engine's decode step (rollout/static.py) computes what its plain formulation computes, bit for bit.

The step is written for few CUDA kernels: the rotary embedding as one broadcast product, a roll and an
add; the attention scale and the padding bias as one add. Each merge keeps every rounding of the plain
step (the same products, the same sums, in the same dtype), so ``reference_step`` below, the step as it
was first written (the model's ``rotate_half``, ``scores * scale + bias``, ``softmax(scores.float())``),
must give the same logits and caches to the last bit, in float32, float64 and bfloat16.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from grpokit.rollout import static
from grpokit.rollout.static import StaticDecoder, rotary_table, rotate, scale_folds
from helpers.models import tiny_causal_lm, tiny_llama, tiny_qwen2


def reference_step(dec: StaticDecoder, tok_n: torch.Tensor, pos_n: torch.Tensor, col, width: int) -> torch.Tensor:
    """``StaticDecoder._forward`` before its kernels were merged: the model's modules one by one."""
    m = dec.backbone
    rotate_half = importlib.import_module(type(dec.model).__module__).rotate_half
    n = tok_n.shape[0]
    H, kvh, d, g = dec.heads, dec.kv_heads, dec.head_dim, dec.groups
    x = m.embed_tokens(tok_n)
    cos, sin = m.rotary_emb(x, pos_n)
    bias = dec.bias[..., :width]
    if isinstance(col, torch.Tensor):
        bias = bias.masked_fill(torch.arange(width) > col, float("-inf"))
    for i, layer in enumerate(m.layers):
        attn, mlp = layer.self_attn, layer.mlp
        h = layer.input_layernorm(x)
        qkv = torch.cat([attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)], dim=-1)
        qk = qkv[:, : (H + kvh) * d].view(n, H + kvh, d)
        qk = qk * cos + rotate_half(qk) * sin
        static._write(dec.keys[i], col, qk[:, H:])
        static._write(dec.values[i], col, qkv[:, (H + kvh) * d :].view(n, kvh, d))
        K, V = dec.keys[i][:, :, :width], dec.values[i][:, :, :width]
        qg = qk[:, :H].reshape(n, kvh, g, d)
        scores = torch.matmul(qg, K.transpose(2, 3)) * dec.scaling + bias
        mixed = torch.matmul(torch.softmax(scores.float(), dim=-1).to(qkv.dtype), V)
        x = x + attn.o_proj(mixed.reshape(n, H * d))
        h = layer.post_attention_layernorm(x)
        gate, up = torch.cat([mlp.gate_proj(h), mlp.up_proj(h)], dim=-1).chunk(2, dim=-1)
        x = x + mlp.down_proj(mlp.act_fn(gate) * up)
    return dec.model.lm_head(m.norm(x))


def _decoders(model, graphs: bool, monkeypatch):
    """Two decoders over the same prefill of ragged prompts (left padding), 2 samples per prompt."""
    ids = torch.tensor([[0, 5, 6, 7], [3, 4, 5, 6]])
    mask = (ids != 0).long()
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    if graphs:
        monkeypatch.setattr(static, "graphable", lambda model, device: True)  # the graphed step's math, on CPU
    decs = []
    with torch.no_grad():
        for _ in range(2):
            cache = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True).past_key_values
            decs.append(StaticDecoder.from_prefill(model, cache, mask, 2, 6, graphs=graphs))
    return decs, pos[:, -1:].repeat_interleave(2, 0) + 1


MODELS = {
    "llama-f32": lambda: tiny_llama(),
    "qwen2-f32": lambda: tiny_qwen2(),  # q/k/v biases
    "llama-f64": lambda: tiny_llama().double(),
    "qwen2-f64": lambda: tiny_qwen2(seed=1).double(),
    "qwen2-bf16": lambda: tiny_qwen2(seed=2).bfloat16(),  # head_dim 8: scale 8**-0.5 is no bfloat16 number
    "llama-bf16-d16": lambda: tiny_causal_lm(32, seed=3, head_dim=16).eval().bfloat16(),  # scale 0.25 folds
}


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS) + ["qwen2-f32-autocast", "llama-f32-d16-autocast"])
def test_the_step_equals_the_plain_step_bit_for_bit(name, graphs, monkeypatch):
    # "-autocast": float32 weights under bfloat16 autocast (model.autocast on a GPU; here the CPU's):
    # bf16 projections and scores over a float32 cache and bias
    autocast = name.endswith("-autocast")
    if autocast:
        model = tiny_qwen2(seed=4) if name.startswith("qwen2") else tiny_causal_lm(32, seed=5, head_dim=16).eval()
    else:
        model = MODELS[name]()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        (fast, plain), pos = _decoders(model, graphs, monkeypatch)
        _compare_steps(fast, plain, pos, graphs, name, torch.bfloat16 if autocast else model.dtype)


def _compare_steps(fast, plain, pos, graphs, name, dtype):
    S = fast.keys[0].shape[2]
    tok = torch.tensor([7, 8, 9, 10])
    with torch.no_grad():
        for _ in range(6):
            if graphs:  # column as a device tensor, the whole cache as the window (what a CUDA graph replays)
                col = torch.tensor([fast.t])
                got = fast._forward(tok, pos, col, S)
                want = reference_step(plain, tok, pos, col, S)
                fast.t += 1
            else:
                got = fast.step(tok, pos)
                want = reference_step(plain, tok, pos, plain.t, plain.t + 1)
            plain.t += 1
            assert got.dtype == want.dtype == dtype
            assert torch.equal(got, want), (name, graphs, (got - want).abs().max())
            tok, pos = want.argmax(-1), pos + 1
    for a, b in zip(fast.keys + fast.values, plain.keys + plain.values):
        assert torch.equal(a, b)


def test_rotate_half_is_a_roll_with_the_sign_on_the_sine_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    cos = torch.tensor([[0.5, 0.25, 0.5, 0.25]])
    sin = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    # rotate_half(x) = cat(-x2, x1) = [-3, -4, 1, 2]; times sin: [-0.3, -0.8, 0.3, 0.8]
    # the table's sine row is cat(sin2, -sin1) = [0.3, 0.4, -0.1, -0.2]; x times it: [0.3, 0.8, -0.3, -0.8],
    # rolled by d/2 = 2: [-0.3, -0.8, 0.3, 0.8], the same four products
    table = rotary_table(cos, sin)
    assert table.tolist() == [
        [[0.5, 0.25, 0.5, 0.25]],
        [[0.30000001192092896, 0.4000000059604645, -0.10000000149011612, -0.20000000298023224]],
    ]
    # x * cos = [0.5, 0.5, 1.5, 1.0]; plus the rotated products: [0.2, -0.3, 1.8, 1.8]
    want = x * cos + torch.tensor([[-3.0, -4.0, 1.0, 2.0]]) * sin
    assert torch.equal(rotate(x, table), want)
    assert torch.allclose(want, torch.tensor([[0.2, -0.3, 1.8, 1.8]]))


@pytest.mark.parametrize("family", static.SUPPORTED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_each_supported_familys_rotary_equals_the_roll_form(family, dtype):
    # every family static.supports() runs has Llama's rotate_half (cat(-x2, x1)); the roll form must
    # give its products exactly: -(a * b) == a * (-b) in IEEE arithmetic, the sum is the same sum
    rotate_half = importlib.import_module(f"transformers.models.{family}.modeling_{family}").rotate_half
    g = torch.Generator().manual_seed(0)
    qk = (torch.randn(5, 7, 16, generator=g) * 4).to(dtype)  # (n, heads, d)
    angles = torch.rand(5, 1, 8, generator=g) * 50
    cos, sin = (torch.cat((f(angles), f(angles)), dim=-1).to(dtype) for f in (torch.cos, torch.sin))
    sin = sin * torch.linspace(0.5, 1.5, 16).to(dtype)  # unequal halves: the roll must not rely on sin1 == sin2
    assert torch.equal(rotate(qk, rotary_table(cos, sin)), qk * cos + rotate_half(qk) * sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [8, 16, 64, 96, 128])
def test_scale_folds_only_where_the_one_add_equals_mul_then_add(dtype, head_dim):
    scale = head_dim**-0.5
    g = torch.Generator().manual_seed(head_dim)
    scores = (torch.randn(8, 2, 3, 50, generator=g) * torch.rand(8, 1, 1, 1, generator=g) * 100).to(dtype)
    scores[0, 0, 0, :4] = torch.tensor([0.0, -0.0, float("inf"), float("-inf")]).to(dtype)
    bias = torch.zeros(8, 1, 1, 50, dtype=dtype).masked_fill(torch.rand(8, 1, 1, 50, generator=g) < 0.3, float("-inf"))
    plain = scores * scale + bias
    if scale_folds(dtype, scale):  # equal to the last bit (the inf score meets a -inf bias or a 0: NaN or inf in both)
        torch.testing.assert_close(torch.add(bias, scores, alpha=scale), plain, rtol=0, atol=0, equal_nan=True)
    # float32/64: mul and add both multiply by the scale rounded to the dtype; bfloat16/float16 on CPU:
    # the add rounds alpha to the dtype, the mul does not, so only 2**-k scales (8**-0.5 is not one) fold
    assert scale_folds(dtype, scale) == (dtype in (torch.float32, torch.float64) or head_dim in (16, 64))
    # > 1: s * scale could overflow to inf (inf + -inf is NaN) where a fused s * scale + -inf is -inf
    assert not scale_folds(torch.float32, 2.0)


def test_the_folded_scale_and_bias_by_hand():
    # head_dim 16: scale 0.25; scores [2, -4, 8, 6] over columns [attend, padding, attend, padding]
    scores = torch.tensor([[[[2.0, -4.0, 8.0, 6.0]]]], dtype=torch.bfloat16)
    bias = torch.tensor([[[[0.0, float("-inf"), 0.0, float("-inf")]]]], dtype=torch.bfloat16)
    assert scale_folds(torch.bfloat16, 0.25)
    # 2 * 0.25 + 0 = 0.5, -4 * 0.25 - inf = -inf, 8 * 0.25 + 0 = 2, 6 * 0.25 - inf = -inf
    assert torch.add(bias, scores, alpha=0.25).tolist() == [[[[0.5, float("-inf"), 2.0, float("-inf")]]]]
