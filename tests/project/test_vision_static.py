"""The static decode engine with image prompts, on the shipped tiny Qwen2-VL (data.task=shapes).

The prefill is the model's own multimodal forward (images and M-RoPE positions from its
get_rope_index), once per prompt; the G samples then decode in the static cache at positions that go
on from the prompt's largest M-RoPE position, not from its token count.
"""

from __future__ import annotations

import pytest
import torch

from grpokit.config.sections import DataConfig
from grpokit.data.prompts import to_prompts
from grpokit.data.tasks import shapes
from grpokit.rollout import static
from grpokit.rollout.hf import SamplingParams, generate


@pytest.fixture(scope="module")
def tiny():
    model, proc = shapes.load_shapes_model()
    return model.eval(), proc


def _prompts(proc, n: int, seed: int):
    return to_prompts(shapes.train_rows(n, seed=seed), proc.tokenizer, DataConfig(), processor=proc)


def _generate(model, proc, prompts, G, params, engine, seed=0, vision=None):
    return generate(
        model,
        [p.ids for p in prompts],
        G,
        params,
        eos_token_ids={proc.tokenizer.eos_token_id},
        pad_token_id=proc.tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(seed),
        engine=engine,
        vision=vision if vision is not None else [p.vision for p in prompts],
    )


def test_auto_picks_the_static_engine_for_the_vision_model(tiny, monkeypatch):
    model, proc = tiny
    assert static.supports(model)
    built = []
    monkeypatch.setattr(static.StaticDecoder, "__init__", _spy(static.StaticDecoder.__init__, built))
    _generate(model, proc, _prompts(proc, 2, 3), 2, SamplingParams(max_new_tokens=3), "auto")
    assert built == [4]  # one decoder for the whole rollout: 2 prompts x 2 samples in one cache


def _spy(init, built):
    def wrapped(self, *a, **k):
        init(self, *a, **k)
        built.append(self.keys[0].shape[0])  # rows at the start (finished rows leave the cache later)

    return wrapped


def test_static_sampling_logprobs_agree_with_the_training_pass_token_by_token(tiny):
    from grpokit.train.logprobs import completion_logprobs
    from grpokit.train.token_batch import make_token_batch

    model, proc = tiny
    prompts = _prompts(proc, 4, 5)  # count prompts (35 tokens) and a box prompt (43): left padding in the prefill
    assert len({len(p.ids) for p in prompts}) == 2
    ro = _generate(model, proc, prompts, 3, SamplingParams(max_new_tokens=10, temperature=1.2), "static")
    batch = make_token_batch(ro, proc.tokenizer.pad_token_id)
    logp, _ = completion_logprobs(model, batch, temperature=1.2)
    assert sum(len(c) for c in ro.completion_ids) > 12  # more than one token per row was compared
    for i, lps in enumerate(ro.sampling_logprobs):  # the training pass: its own positions, the same images
        assert torch.allclose(logp[i, : len(lps)], torch.tensor(lps), atol=1e-4), i


def test_static_and_dynamic_engines_sample_the_same_tokens(tiny):
    model, proc = tiny
    prompts = _prompts(proc, 4, 11)
    for params in (SamplingParams(max_new_tokens=12, temperature=0.0), SamplingParams(max_new_tokens=8)):
        runs = {e: _generate(model, proc, prompts, 2, params, e) for e in ("static", "dynamic")}
        assert runs["static"].completion_ids == runs["dynamic"].completion_ids
        for a, b in zip(runs["static"].sampling_logprobs, runs["dynamic"].sampling_logprobs):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


def test_decode_positions_go_on_from_the_largest_mrope_position(tiny, monkeypatch):
    model, proc = tiny
    prompts = _prompts(proc, 4, 5)
    lengths = [len(p.ids) for p in prompts]
    assert sorted(set(lengths)) == [35, 43]
    # A count prompt: <|vision_start|> at 0, its 16 image tokens a 4x4 grid at 1 + (t, row, col) (at most
    # 1 + 3 = 4), <|vision_end|> at 5, then 17 text tokens at 6..22: the first new token sits at 23 =
    # 35 - 16 + 4, not at 35. A box prompt (43 tokens, 25 of text): 43 - 12 = 31.
    seen = []
    step = static.StaticDecoder.step
    monkeypatch.setattr(
        static.StaticDecoder, "step", lambda self, tok, pos: seen.append(pos.clone()) or step(self, tok, pos)
    )
    _generate(model, proc, prompts, 1, SamplingParams(max_new_tokens=3, temperature=0.0), "static")
    assert seen[0][:, 0].tolist() == [n - 12 for n in lengths]


def test_the_image_changes_what_the_static_engine_samples(tiny):
    model, proc = tiny
    prompts = [p for p in _prompts(proc, 8, 5) if len(p.ids) == 35][:4]  # the same question, four scenes
    assert len(prompts) == 4 and all(p.ids == prompts[0].ids for p in prompts)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    own = _generate(model, proc, prompts, 1, params, "static")
    swapped = _generate(model, proc, prompts, 1, params, "static", vision=[p.vision for p in prompts[::-1]])
    # identical token ids: only the pixels differ, so row i with row 3-i's image samples what row 3-i did
    assert swapped.completion_ids == own.completion_ids[::-1]
    for a, b in zip(swapped.sampling_logprobs, own.sampling_logprobs[::-1]):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    first = torch.tensor([lps[0] for lps in own.sampling_logprobs])  # greedy: the first token's log-probability
    assert (first - first[0]).abs().max() > 1e-3  # differs between scenes
    blank = [{**p.vision, "pixel_values": torch.zeros_like(p.vision["pixel_values"])} for p in prompts]
    other = torch.tensor(
        [lps[0] for lps in _generate(model, proc, prompts, 1, params, "static", vision=blank).sampling_logprobs]
    )
    assert (other - first).abs().min() > 1e-3  # a blank image changes every row


def test_two_shapes_steps_train_with_the_static_engine(tmp_path, monkeypatch):
    from grpokit.config.io import apply_overrides
    from grpokit.config.sections import Config
    from grpokit.train import run_data
    from grpokit.train.loop import Trainer

    monkeypatch.setattr(run_data, "TASK_TRAIN_ROWS", 16)  # not 8192 scenes drawn and encoded for 2 steps
    built = []
    monkeypatch.setattr(static.StaticDecoder, "__init__", _spy(static.StaticDecoder.__init__, built))
    cfg = apply_overrides(
        Config(),
        [
            "data.task=shapes",
            "train.steps=2",
            "train.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=6",
            "data.eval_size=2",
            "record.report=false",
            f"train.out={tmp_path}",
            "train.save_every=0",
        ],
    )
    summary = Trainer(cfg, quiet=True).train()
    assert summary["steps"] == 2
    assert built.count(4) == 2  # each step's rollout in one static cache: 2 prompts x 2 samples (the evals: 2 x 1)


def test_a_tiny_random_qwen2_5_vl_decodes_statically_too(tiny):
    """Qwen2.5-VL's language model has Qwen2-VL's shape (its vision tower differs, and only the prefill
    sees it): a random toy of it, on the demo's processor and token ids, samples the same tokens on both
    engines and agrees with the training pass."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from grpokit.train.logprobs import completion_logprobs
    from grpokit.train.token_batch import make_token_batch

    _, proc = tiny
    text = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=52,
        max_position_embeddings=256,
        eos_token_id=1,
        pad_token_id=0,
        bos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    )
    tower = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=8,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=64,
        window_size=16,
        fullatt_block_indexes=[0],
    )
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(
            text_config=text,
            vision_config=tower,
            image_token_id=4,
            video_token_id=6,
            vision_start_token_id=3,
            vision_end_token_id=5,
            eos_token_id=1,
            pad_token_id=0,
            bos_token_id=None,
        )
    ).eval()
    assert static.supports(model)
    prompts = _prompts(proc, 4, 5)
    runs = {e: _generate(model, proc, prompts, 2, SamplingParams(max_new_tokens=8), e) for e in ("static", "dynamic")}
    assert runs["static"].completion_ids == runs["dynamic"].completion_ids
    assert sum(len(c) for c in runs["static"].completion_ids) > 16  # random weights: long answers, many steps compared
    logp, _ = completion_logprobs(model, make_token_batch(runs["static"], proc.tokenizer.pad_token_id))
    for i, lps in enumerate(runs["static"].sampling_logprobs):
        assert torch.allclose(logp[i, : len(lps)], torch.tensor(lps), atol=1e-4), i


def test_a_lora_vision_policy_decodes_statically_as_the_dynamic_engine_does():
    """PEFT wraps the VLM (adapters on the language model's linears only): auto takes the static
    engine through the wrapper and samples what the dynamic loop samples, adapters included."""
    pytest.importorskip("peft")
    from grpokit.config.sections import ModelConfig
    from grpokit.train.lora import add_adapters

    model, proc = shapes.load_shapes_model()
    model = add_adapters(model, ModelConfig(lora_rank=4)).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    assert static.supports(model)
    prompts = _prompts(proc, 4, 11)
    runs = {e: _generate(model, proc, prompts, 2, SamplingParams(max_new_tokens=8), e) for e in ("static", "dynamic")}
    assert runs["static"].completion_ids == runs["dynamic"].completion_ids
    for a, b in zip(runs["static"].sampling_logprobs, runs["dynamic"].sampling_logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


class _AxesOnly(torch.nn.Module):
    """transformers 5.17's Qwen2-VL rotary: M-RoPE's (3, batch, positions) positions only (2-D ones fail
    with the IndexError it raised), one mixed (batch, positions, d) table out."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.inv_freq = inner, inner.inv_freq

    def forward(self, x, position_ids):
        if position_ids.dim() != 3:
            raise IndexError("too many indices for tensor of dimension 2")
        return self.inner(x, position_ids)


def test_a_rotary_that_takes_only_mrope_positions_gets_them_and_gives_the_same_tables(tiny):
    model, _ = tiny
    real = static.text_model(model).rotary_emb
    axes_only = _AxesOnly(real)
    axes = static.rotary_axes(real)  # 0 from transformers 5.24 (it broadcasts 2-D positions), 3 in 5.17
    assert axes in (0, 3) and static.rotary_axes(axes_only) == 3
    x, pos = torch.zeros(1, 1, 1), torch.arange(7)[None]
    for got, want in zip(static.text_rotary(axes_only, 3, x, pos), static.text_rotary(real, axes, x, pos)):
        assert torch.equal(got, want)  # a text position is the same number on all three axes
    neither = _AxesOnly(real)
    neither.forward = lambda x, position_ids: (_ for _ in ()).throw(RuntimeError("no table"))
    assert static.rotary_axes(neither) is None
