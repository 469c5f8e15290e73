"""Padding-free (packed) forward passes equal the padded path in float64: values and gradients."""

from __future__ import annotations

import torch

import grpokit.train.hidden_states as hidden_states
from grpokit.train.logprobs import completion_logprobs
from grpokit.train.packing import pack
from grpokit.train.token_batch import make_token_batch
from grpokit.types import Episode, Rollout
from helpers.models import tiny_causal_lm


def _rollout(episodes=False):
    # 3 prompts of lengths 4, 2, 3; G = 2; completion lengths 1 .. 9
    prompts = [[1, 5, 6, 7], [1, 9], [1, 3, 4]]
    comps = [[5] * 9, [6, 2], [7, 8, 9, 2], [3], [4] * 8, [10, 11, 2]]
    eps = [Episode([1] * len(c), [0] * len(c)) for c in comps] if episodes else None
    if episodes:  # row 0: tokens 3..5 written by an environment (context, not loss)
        eps[0] = Episode([1, 1, 1, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1, 1])
    return Rollout(prompts, comps, [[0.0] * len(c) for c in comps], ["length"] * 6, 2, eps)


def _models():
    # Llama with its own head, Qwen2 with tied embeddings, both in float64
    llama = tiny_causal_lm(16, max_positions=64)
    qwen = tiny_causal_lm(16, arch="qwen2", max_positions=64, tie_word_embeddings=True)
    return [m.double() for m in (llama, qwen)]


def test_pack_hand_example():
    # row 0: prompt [1, 5, 6, 7] + 9 completion tokens = 13 packed tokens at 0..12, positions 0..12;
    # its completion token 0 is predicted by packed state 3 (the last prompt token), token 8 by state 11.
    # row 1 starts at 13: prompt 4 + 2 completion -> states 16, 17.
    p = pack(make_token_batch(_rollout(), pad_token_id=0))
    # rows: 4+9, 4+2, 2+4, 2+1, 3+8, 3+3 real tokens
    assert p.input_ids.shape == (1, 13 + 6 + 6 + 3 + 11 + 6)  # no padding: 45 real tokens
    assert p.position_ids[0, :15].tolist() == list(range(13)) + [0, 1]
    assert p.state_index[:11].tolist() == list(range(3, 12)) + [16, 17]
    assert p.targets[:11].tolist() == [5] * 9 + [6, 2]
    assert p.slot[:11].tolist() == list(range(9)) + [9, 10]  # T = 9: row 1 starts at slot 9


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_packed_equals_padded_values_and_gradients_float64(monkeypatch):

    # the padded path without prompt sharing (which adds its own ~1e-8 relative summation differences)
    monkeypatch.setattr(hidden_states, "PROMPT_SHARING_TYPES", ())
    for episodes in (False, True):
        batch = make_token_batch(_rollout(episodes), pad_token_id=0)
        m = batch.completion_mask.double()
        adv = torch.linspace(-1, 1, m.numel(), dtype=torch.float64).view_as(m)
        for model in _models():
            out = {}
            for packed in (False, True):
                model.zero_grad()
                lp, ent = completion_logprobs(
                    model, batch, packed=packed, with_entropy=True, entropy_grad=True, temperature=0.7
                )
                ((lp * adv + 0.1 * ent) * m).sum().backward()
                out[packed] = (lp.detach() * m, ent.detach() * m, _grads(model))
            assert torch.allclose(out[True][0], out[False][0], atol=1e-12, rtol=0)
            assert torch.allclose(out[True][1], out[False][1], atol=1e-12, rtol=0)
            for a, b in zip(out[True][2], out[False][2]):
                assert torch.allclose(a, b, atol=1e-10, rtol=0)


def test_packed_forward_computes_no_padding():
    batch = make_token_batch(_rollout(), pad_token_id=0)
    model = _models()[0]
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda mod, a, o: seen.append(a[0].numel()))
    with torch.no_grad():
        completion_logprobs(model, batch, packed=True)
    hook.remove()
    assert seen == [45]  # the real tokens only (6 rows x 13 columns = 78 padded)


def test_a_long_row_goes_packed_only_to_an_attention_kernel_without_a_dense_mask(monkeypatch):
    # SDPA and eager get an (S, S) mask for a packed row (the whole 0.5B GRPO batch asked 16 GiB on an
    # H100), so a row over DENSE_MASK_MAX_TOKENS stays padded there; FlexAttention / flash take it packed.
    import grpokit.train.packing as packing

    batch = make_token_batch(_rollout(), pad_token_id=0)
    model = _models()[0]
    for limit, kernel, fits in (
        (45, "sdpa", True),
        (44, "sdpa", False),
        (44, "eager", False),
        (44, "flex_attention", True),
        (44, "flash_attention_2", True),
    ):
        monkeypatch.setattr(packing, "DENSE_MASK_MAX_TOKENS", limit)  # the batch packs into 45 tokens
        model.config._attn_implementation = kernel
        assert pack(batch).input_ids.shape[1] == 45
        assert packing.mask_fits(model, batch) == fits, (limit, kernel)
    model.config._attn_implementation = "sdpa"
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda mod, a, o: seen.append(a[0].numel()))
    with torch.no_grad():
        completion_logprobs(model, batch, packed=True)
    hook.remove()
    assert seen == [12, 54]  # the padded path (prompts once: 3 x 4 columns; completions: 6 x 9), not 45 packed


def test_a_model_that_cannot_pack_falls_back_to_the_padded_path():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=32, n_layer=1, n_head=2, n_positions=64)).double().eval()
    batch = make_token_batch(_rollout(), pad_token_id=0)
    with torch.no_grad():
        a, _ = completion_logprobs(gpt, batch, packed=True)
        b, _ = completion_logprobs(gpt, batch, packed=False)
    assert torch.equal(a * batch.completion_mask, b * batch.completion_mask)


def test_trainer_step_packed_matches_padded(tmp_path):
    from grpokit.config import Config, apply_overrides
    from grpokit.train import Trainer

    out = {}
    for mode in ("packed", "padded"):
        over = [
            "train.steps=1",
            "train.prompts_per_step=2",
            "rollout.group_size=4",
            "data.eval_size=4",
            "record.sinks=[jsonl]",
            "record.report=false",
            "train.threads=1",
            f"train.packing={mode}",
            f"train.out={tmp_path / mode}",
        ]
        tr = Trainer(apply_overrides(Config(), over), quiet=True)
        assert tr.packed == (mode == "packed")
        out[mode] = tr.train_step()
    for key in ("loss", "grad_norm", "entropy", "mismatch/logp_abs_diff_mean"):  # float32: summation order only
        assert abs(out["packed"][key] - out["padded"][key]) <= 1e-4 * max(1.0, abs(out["padded"][key])), key


def test_no_pass_holds_tokens_by_vocab_logits_and_chunks_equal_full_logits_float64(monkeypatch):
    import grpokit.train.logprobs as L

    # force the memory-flat head: every chunk of 4 positions recomputed in backward, never (K, V) at once
    monkeypatch.setattr(L, "SMALL_LOGITS_ELEMENTS", 0)
    monkeypatch.setattr(L, "LOGITS_CHUNK_ELEMENTS", 4 * 16)  # V = 16: 4 positions per chunk
    monkeypatch.setattr(hidden_states, "PROMPT_SHARING_TYPES", ())
    batch = make_token_batch(_rollout(), pad_token_id=0)
    m = batch.completion_mask.double()
    model = _models()[0]
    rows = []
    hook = model.get_output_embeddings().register_forward_hook(lambda mod, a, o: rows.append(o.shape[0]))
    out = {}
    for packed in (True, False):
        model.zero_grad()
        lp, _ = completion_logprobs(model, batch, packed=packed)
        (lp * m).sum().backward()
        out[packed] = (lp.detach() * m, _grads(model))
    hook.remove()
    assert max(rows) == 4  # forward and recompute: 4 positions x 16 logits at a time
    # the reference: the model's full (N, L, V) logits, log-softmax, gather
    model.zero_grad()
    T = batch.width
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits
    ref = torch.log_softmax(logits[:, -T - 1 : -1], -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    (ref * m).sum().backward()
    for packed in (True, False):
        assert torch.allclose(out[packed][0], ref.detach() * m, atol=1e-12, rtol=0)
        for a, b in zip(out[packed][1], _grads(model)):
            assert torch.allclose(a, b, atol=1e-9, rtol=1e-9)


def test_a_softcapped_head_falls_back_to_full_logits_with_equal_values_and_gradients():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    # Gemma-2 soft-caps its logits (tanh after the head), so the chunked linear head cannot stand in
    # for it: both the packed and the padded request take one full forward, equal to the model's logits.
    torch.manual_seed(0)
    gemma = Gemma2ForCausalLM(
        Gemma2Config(
            vocab_size=16,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=64,
            final_logit_softcapping=5.0,
            attn_implementation="eager",
        )
    ).double()
    assert hidden_states.decoder_stack(gemma) is None
    # prompts of one length: Gemma-2's eager attention turns a left-padded row into NaN (its fully
    # masked padding rows), in the model's own forward too; right-padded completions are fine
    prompts, comps = [[1, 5, 6], [1, 9, 4]], [[5] * 6, [6, 2], [7, 8, 9, 2], [3]]
    batch = make_token_batch(
        Rollout(prompts, comps, [[0.0] * len(c) for c in comps], ["length"] * 4, 2), pad_token_id=0
    )
    m, T = batch.completion_mask.double(), batch.width
    logits = gemma(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits
    ref = torch.log_softmax(logits[:, -T - 1 : -1], -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    (ref * m).sum().backward()
    ref_grads = _grads(gemma)
    for packed in (True, False):
        gemma.zero_grad()
        lp, _ = completion_logprobs(gemma, batch, packed=packed, buckets=1)
        (lp * m).sum().backward()
        assert torch.allclose(lp.detach() * m, ref.detach() * m, atol=1e-12, rtol=0)
        for a, b in zip(_grads(gemma), ref_grads):
            assert torch.allclose(a, b, atol=1e-9, rtol=1e-9)
