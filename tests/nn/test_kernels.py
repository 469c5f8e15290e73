"""oneDNN linears (grpokit.nn.kernels): same values and gradients as F.linear, and F.linear wherever
oneDNN does not apply."""

import copy

import pytest
import torch

from grpokit.config import ConfigError
from grpokit.nn import kernels

needs_onednn = pytest.mark.skipif(not kernels.onednn_available(), reason="torch build without oneDNN")


@needs_onednn
@pytest.mark.parametrize("weight_grad_onednn", [False, True])  # AVX2 CPUs, AVX-512 ones
def test_routed_model_matches_plain_model_in_values_and_every_gradient(tiny_model, monkeypatch, weight_grad_onednn):
    monkeypatch.setattr(kernels, "WEIGHT_GRAD_ONEDNN", weight_grad_onednn)
    calls = []
    real = kernels._onednn
    monkeypatch.setattr(kernels, "_onednn", lambda *a: calls.append(1) or real(*a))
    fast = copy.deepcopy(tiny_model)
    n_linear = sum(type(m) is torch.nn.Linear for m in tiny_model.modules())
    assert kernels.use_onednn_linears(fast) == n_linear == 2 * 7 + 1  # 2 layers x (q k v o gate up down) + head
    assert kernels.use_onednn_linears(fast) == n_linear  # idempotent
    ids = torch.randint(0, tiny_model.config.vocab_size, (4, 40))  # 160 rows >= kernels.MIN_ROWS
    outs = []
    for model in (tiny_model, fast):
        model.zero_grad()
        logits = model(input_ids=ids).logits
        (logits.float().log_softmax(-1)[..., 0].sum() + logits.pow(2).mean()).backward()
        outs.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    (a, ga), (b, gb) = outs
    # every forward and input gradient went through oneDNN, and every weight gradient where it is asked to
    assert len(calls) == (3 if weight_grad_onednn else 2) * n_linear
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-6)


@needs_onednn
def test_linear_with_bias_and_partial_gradients():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3)
    ref = copy.deepcopy(lin)
    kernels.use_onednn_linears(lin)
    x = torch.randn(2, 80, 5, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    y, y_ref = lin(x), ref(x_ref)
    assert y.shape == (2, 80, 3) and torch.allclose(y, y_ref, atol=1e-6)
    (y * torch.arange(3.0)).sum().backward()
    (y_ref * torch.arange(3.0)).sum().backward()
    assert torch.allclose(x.grad, x_ref.grad, atol=1e-6)
    assert torch.allclose(lin.weight.grad, ref.weight.grad, atol=1e-6)
    assert torch.allclose(lin.bias.grad, ref.bias.grad, atol=1e-6)
    # a frozen layer (LoRA base, reference model) still passes the gradient to its input
    lin.weight.requires_grad_(False)
    lin.bias.requires_grad_(False)
    x2 = torch.randn(200, 5, requires_grad=True)
    lin(x2).sum().backward()
    assert torch.allclose(x2.grad, lin.weight.sum(0).expand(200, 5), atol=1e-6)


@needs_onednn
def test_layers_that_onednn_does_not_cover_call_f_linear(monkeypatch):
    calls = []
    monkeypatch.setattr(kernels, "_onednn", lambda *a: calls.append(1) or torch.nn.functional.linear(*a))
    lin = torch.nn.Linear(4, 2)
    kernels.use_onednn_linears(lin)
    rows = kernels.MIN_ROWS
    lin(torch.randn(rows, 4))
    assert calls == [1]
    lin(torch.randn(rows - 1, 4))  # a decode step's few rows: F.linear
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lin(torch.randn(rows, 4)).dtype == torch.bfloat16
    lin.to(torch.bfloat16)
    lin(torch.randn(rows, 4, dtype=torch.bfloat16))
    assert calls == [1]  # neither few rows, autocast nor half-precision weights went through oneDNN


def test_cpu_matmul_modes(monkeypatch):
    assert not kernels.wants_onednn("torch", torch.device("cpu"))
    assert not kernels.wants_onednn("onednn", torch.device("cuda"))  # CPU only: GPUs keep their own kernels
    with pytest.raises(ValueError, match="auto, onednn, torch"):
        kernels.wants_onednn("mkl", torch.device("cpu"))
    monkeypatch.setattr(kernels, "onednn_available", lambda: True)
    for vendor, expected in (("AuthenticAMD", True), ("HygonGenuine", True), ("GenuineIntel", False), ("", False)):
        monkeypatch.setattr(kernels, "cpu_vendor", lambda v=vendor: v)
        assert kernels.wants_onednn("auto", torch.device("cpu")) is expected, vendor
    monkeypatch.setattr(kernels, "onednn_available", lambda: False)
    with pytest.raises(ConfigError, match="cpu_matmul='onednn'"):
        kernels.wants_onednn("onednn", torch.device("cpu"))
    monkeypatch.setattr(kernels, "cpu_vendor", lambda: "AuthenticAMD")
    assert not kernels.wants_onednn("auto", torch.device("cpu"))


def test_cpuinfo_fields_read_from_the_first_processor(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels.platform, "machine", lambda: "x86_64")
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512bw\n\n"
        "processor\t: 1\nvendor_id\t: Other\nflags\t\t: fpu\n"
    )
    assert kernels._cpuinfo("vendor_id", str(info)) == "AuthenticAMD"
    assert "avx512f" in kernels._cpuinfo("flags", str(info)).split()
    assert kernels._cpuinfo("model name", str(info)) == ""  # a field the file lacks
    assert kernels._cpuinfo("flags", str(tmp_path / "missing")) == ""
    monkeypatch.setattr(kernels.platform, "machine", lambda: "aarch64")
    assert kernels._cpuinfo("vendor_id", str(info)) == ""  # not x86: no vendor rule applies
    # the rule follows the flags: with AVX-512 oneDNN beats MKL from 16 rows, weight gradients too (bench/RESULTS.md)
    assert kernels.rule_for(frozenset({"fpu", "avx2", "avx512f"})) == (16, True)
    assert kernels.rule_for(frozenset({"fpu", "avx2", "fma"})) == (128, False)
    assert kernels.rule_for(frozenset()) == (128, False)  # no flags read (Arm, no /proc/cpuinfo)


def test_bad_cpu_matmul_is_a_config_error():
    from grpokit.config import Config
    from grpokit.validation import validate

    cfg = Config()
    cfg.model.cpu_matmul = "mkl"
    with pytest.raises(ConfigError, match="model.cpu_matmul"):
        validate(cfg)


@needs_onednn
def test_fused_linear_equals_each_module_and_declines_what_it_cannot_pack():
    torch.manual_seed(0)
    q, k = torch.nn.Linear(16, 8), torch.nn.Linear(16, 4, bias=False)  # one bias missing: zeros in its place
    x = torch.randn(5, 1, 16)
    assert kernels.fused_linear([q, k]) is None  # not routed to oneDNN: the caller calls the modules
    for m in (q, k):
        kernels.use_onednn_linears(m)
    run = kernels.fused_linear([q, k])
    y = run(x)
    assert y.shape == (5, 1, 12)
    yq, yk = y.split([8, 4], dim=-1)
    with torch.no_grad():
        assert torch.allclose(yq, torch.nn.functional.linear(x, q.weight, q.bias), atol=1e-6)
        assert torch.allclose(yk, x @ k.weight.T, atol=1e-6)
        q.weight.add_(1.0)  # a snapshot: later weight updates do not reach the reordered copy
    assert torch.equal(run(x)[..., :8], yq)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert kernels.fused_linear([q, k]) is None  # built under autocast: the caller calls the modules
        assert run(x).dtype == torch.bfloat16  # autocast entered after building: the modules' own path

    class LoRALike(torch.nn.Linear):  # a subclass keeps its own forward, so it is never packed
        pass

    lora = LoRALike(16, 8)
    kernels.use_onednn_linears(lora)
    assert kernels.fused_linear([q, lora]) is None
    assert kernels.fused_linear([]) is None


@needs_onednn
def test_static_decode_on_routed_linears_samples_what_the_model_does(tiny_model, monkeypatch):
    # the fused, reordered decode projections compute the model's function: same greedy tokens as the
    # dynamic-cache path (the model's own forward), sampling logprobs to float32 rounding
    from grpokit.rollout.hf import SamplingParams, generate
    from helpers.models import tiny_qwen2

    packed = []
    real = kernels.fused_linear

    def counted(mods):
        run = real(mods)
        packed.append(len(mods) if run is not None else 0)
        return run

    monkeypatch.setattr(kernels, "fused_linear", counted)
    prompts = [[1, 5, 6, 7, 8], [1, 9], [1, 3, 4]]
    for model in (tiny_model, tiny_qwen2()):
        kernels.use_onednn_linears(model)
        for params in (SamplingParams(max_new_tokens=10, temperature=0), SamplingParams(max_new_tokens=10)):
            a = generate(
                model,
                prompts,
                4,
                params,
                engine="static",
                generator=torch.Generator().manual_seed(1),
                eos_token_ids={2, 3},
                pad_token_id=0,
            )
            b = generate(
                model,
                prompts,
                4,
                params,
                engine="dynamic",
                generator=torch.Generator().manual_seed(1),
                eos_token_ids={2, 3},
                pad_token_id=0,
            )
            assert a.completion_ids == b.completion_ids and a.finish_reasons == b.finish_reasons
            for x, y in zip(a.sampling_logprobs, b.sampling_logprobs):
                assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-5)
            assert packed[:9] == [3, 1, 2, 1, 3, 1, 2, 1, 1]  # per layer q/k/v, o, gate/up, down; then the head
            packed.clear()


@needs_onednn
def test_static_decode_with_fused_biases_and_no_grouping_matches_the_model():
    # Llama with q/k/v/o and MLP biases, one kv head per query head (no grouping), and a Mistral:
    # the fused projections carry every bias, and the step still samples what the model does
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    from grpokit.rollout.hf import SamplingParams, generate

    torch.manual_seed(0)
    common = dict(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    models = [
        LlamaForCausalLM(
            LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=4, attention_bias=True, mlp_bias=True)
        ),
        MistralForCausalLM(MistralConfig(**common, num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    ]
    for model in models:
        model.eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 1:
                    p.normal_(0, 0.5)  # non-zero biases (and norm weights)
        kernels.use_onednn_linears(model)
        for params in (SamplingParams(max_new_tokens=8, temperature=0), SamplingParams(max_new_tokens=8)):
            kw = dict(eos_token_ids={2, 3}, pad_token_id=0)
            a = generate(
                model,
                [[1, 5, 6], [1, 9, 4, 7]],
                3,
                params,
                engine="static",
                generator=torch.Generator().manual_seed(4),
                **kw,
            )
            b = generate(
                model,
                [[1, 5, 6], [1, 9, 4, 7]],
                3,
                params,
                engine="dynamic",
                generator=torch.Generator().manual_seed(4),
                **kw,
            )
            assert a.completion_ids == b.completion_ids
            for x, y in zip(a.sampling_logprobs, b.sampling_logprobs):
                assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-5)


def test_rms_norm_of_is_the_models_norm_bit_for_bit_and_keeps_the_module_elsewhere():
    # a float32 Llama/Qwen2 RMSNorm becomes torch.rms_norm with the module's values to the last bit (and
    # follows the live weight, which the optimizer updates in place); float64 (the module computes in
    # float32 and casts back), other norms and bfloat16 inputs keep the module
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    from grpokit.nn.kernels import rms_norm_of

    g = torch.Generator().manual_seed(0)
    for cls in (LlamaRMSNorm, Qwen2RMSNorm):
        norm = cls(48, eps=1e-5)
        norm.weight.data = torch.randn(48, generator=g)
        fn = rms_norm_of(norm)
        assert fn is not norm
        x = torch.randn(16, 48, generator=g) * 5
        assert torch.equal(fn(x), norm(x))
        with torch.no_grad():
            norm.weight.mul_(2)
        assert torch.equal(fn(x), norm(x))
        assert torch.equal(fn(x.bfloat16()), norm(x.bfloat16()))  # the module's path
    f64 = LlamaRMSNorm(8).double()
    assert rms_norm_of(f64) is f64
    other = torch.nn.LayerNorm(8)
    assert rms_norm_of(other) is other
