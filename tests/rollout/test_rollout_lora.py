"""The static decode engine on a LoRA policy (a PEFT wrapper): it must sample what the adapted model
samples, not fall back to the slow dynamic-cache loop (bench/RESULTS.md: 7B LoRA on the card)."""

import pytest
import torch

from grpokit.rollout import hf, static
from grpokit.rollout.hf import SamplingParams, generate
from grpokit.train.logprobs import completion_logprobs
from grpokit.train.token_batch import make_token_batch
from helpers.models import perturb_lora_b, tiny_qwen2

pytest.importorskip("peft")


def lora_policy(seed: int = 2):
    """A tiny Qwen2 in PEFT with rank-4 adapters whose B is non-zero, so the adapters change the policy."""
    from grpokit.config.sections import ModelConfig

    return with_adapters(tiny_qwen2(seed=seed), ModelConfig(lora_rank=4), seed)


def with_adapters(base, cfg, seed: int):
    """``base`` in PEFT with ``cfg``'s adapters, their B drawn non-zero (so they change the policy), in eval mode."""
    from grpokit.train.lora import add_adapters

    return perturb_lora_b(add_adapters(base, cfg).eval(), seed)


PROMPTS = [[1, 5, 6, 7, 8], [1, 9], [1, 3, 4]]
KW = dict(eos_token_ids={2, 3}, pad_token_id=0)


def sample(model, engine: str, params=None):
    params = params or SamplingParams(max_new_tokens=10)
    return generate(model, PROMPTS, 4, params, engine=engine, generator=torch.Generator().manual_seed(1), **KW)


def test_auto_picks_the_static_engine_for_a_peft_model():
    model = lora_policy()
    assert static.supports(model)
    assert hf._uses_static(model, "auto", None, None) is True


def assert_engines_agree(model, atol: float) -> None:
    """Static and dynamic engines sample the same tokens (greedy and seeded), their logprobs within ``atol``."""
    for params in (SamplingParams(max_new_tokens=10, temperature=0), SamplingParams(max_new_tokens=10)):
        a, b = sample(model, "static", params), sample(model, "dynamic", params)
        assert a.completion_ids == b.completion_ids and a.finish_reasons == b.finish_reasons
        for x, y in zip(a.sampling_logprobs, b.sampling_logprobs):
            torch.testing.assert_close(torch.tensor(x), torch.tensor(y), atol=atol, rtol=0)


def test_static_engine_samples_the_adapted_policy_like_the_dynamic_engine():
    assert_engines_agree(lora_policy(), atol=1e-5)


def test_static_sampling_logprobs_are_the_adapted_models_not_the_bases():
    model = lora_policy()
    ro = sample(model, "static")
    batch = make_token_batch(ro, pad_token_id=0)
    m = batch.completion_mask
    sampled = torch.zeros(m.shape)
    for i, lp in enumerate(ro.sampling_logprobs):
        sampled[i, : len(lp)] = torch.tensor(lp)
    with torch.no_grad():
        adapted, _ = completion_logprobs(model, batch)
        with model.disable_adapter():
            base, _ = completion_logprobs(model, batch)
    torch.testing.assert_close(adapted * m, sampled * m, atol=1e-4, rtol=0)
    assert ((base - adapted).abs() * m).max() > 0.05  # the adapters matter: a base decode would be caught


def test_graphed_step_math_on_a_peft_model_equals_its_eager_step(monkeypatch):
    """What a CUDA graph of a LoRA policy replays (checked on CPU, where no graph is needed to run it)."""
    model = lora_policy()
    ids = torch.tensor([[0, 5, 6, 7], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        caches = [model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True).past_key_values]
        caches.append(model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True).past_key_values)
        eager = static.StaticDecoder.from_prefill(model, caches[0], mask, 2, 5)
        monkeypatch.setattr(static, "graphable", lambda model, device: True)
        fixed = static.StaticDecoder.from_prefill(model, caches[1], mask, 2, 5, graphs=True)
        tok, p = torch.tensor([7, 8, 9, 10]), pos[:, -1:].repeat_interleave(2, 0) + 1
        for _ in range(5):
            want = eager.step(tok, p)
            got = fixed._forward(tok, p, torch.tensor([fixed.t]), fixed.keys[0].shape[2])
            fixed.t += 1
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            tok, p = want.argmax(-1), p + 1


def qlora_policy(tmp_path, compute_dtype=torch.float32, seed: int = 2):
    """QLoRA as grpokit builds it, on CPU: a Qwen2 loaded by transformers in 4-bit NF4 through
    bitsandbytes (its CPU kernels; hidden 128, as the 64-value quantisation blocks need), then PEFT
    adapters with non-zero B."""
    import transformers

    from grpokit.config.sections import ModelConfig

    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp_path)
    quant = transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quant, device_map="cpu")
    return with_adapters(base, ModelConfig(lora_rank=4, quantization="4bit"), seed)


@pytest.mark.parametrize("compute_dtype", [torch.float32, torch.bfloat16])
def test_a_qlora_policy_decodes_statically_as_the_dynamic_engine_does(tmp_path, compute_dtype):
    pytest.importorskip("bitsandbytes")
    model = qlora_policy(tmp_path, compute_dtype)
    assert type(static.unwrapped(model).model.layers[0].mlp.up_proj.base_layer).__name__ == "Linear4bit"
    assert static.unwrapped(model).hf_quantizer is not None and static.supports(model)
    # the same tokens on both engines; their logprobs within 2e-4 in float32, 1e-3 in bfloat16, whose 4-bit layers
    # round to 8 bits of mantissa in an order each engine's cache layout sets (2.4e-4 seen at -4.12: a relative 6e-5)
    assert_engines_agree(model, atol=2e-4 if compute_dtype == torch.float32 else 1e-3)


def test_a_quantised_base_replays_cuda_graphs_as_a_full_precision_one():
    """bitsandbytes' 4-bit layers captured in a CUDA graph decoded as eagerly on an H200 (tests/project/test_gpu.py):
    QLoRA's static decode replays graphs on a card as a LoRA policy's does; never on a CPU."""
    model = lora_policy()
    assert static.graphable(model, torch.device("cuda"))
    model.get_base_model().hf_quantizer = object()  # what transformers sets when bitsandbytes loads the base
    assert static.supports(model) and static.graphable(model, torch.device("cuda"))
    assert not static.graphable(model, torch.device("cpu"))
