"""Rollout engine: shared prompt cache + row dropping must sample from exactly the model's distribution."""

import copy

import pytest
import torch

from grpokit.rollout.hf import SamplingParams, generate
from grpokit.rollout.sampling import process_logits
from grpokit.train.logprobs import completion_logprobs
from grpokit.train.token_batch import make_token_batch
from helpers.models import tiny_qwen2


def test_sampling_logprobs_match_a_full_forward(tiny_model):
    # prompts of different lengths (left padding), G = 3, EOS id 2 reachable -> rows finish at different times
    prompts = [[1, 5, 6, 7], [1, 9], [1, 3, 4]]
    g = torch.Generator().manual_seed(0)
    ro = generate(
        tiny_model, prompts, 3, SamplingParams(max_new_tokens=12), eos_token_ids={2, 3, 4}, pad_token_id=0, generator=g
    )
    assert ro.num_sequences == 9 and len(ro.finish_reasons) == 9
    lengths = [len(c) for c in ro.completion_ids]
    assert min(lengths) < 12 or all(r == "length" for r in ro.finish_reasons)
    for c, r in zip(ro.completion_ids, ro.finish_reasons):
        assert (r == "eos") == (c[-1] in {2, 3, 4}) and (r == "length") == (len(c) == 12 and c[-1] not in {2, 3, 4})
    batch = make_token_batch(ro, pad_token_id=0)
    logp, ent = completion_logprobs(tiny_model, batch, with_entropy=True, chunk_size=5)
    ref = torch.zeros_like(logp)
    for i, lp in enumerate(ro.sampling_logprobs):
        ref[i, : len(lp)] = torch.tensor(lp)
    m = batch.completion_mask
    assert torch.allclose(logp * m, ref * m, atol=1e-4)
    assert (ent[m.bool()] > 0).all()


def test_seeded_sampling_is_reproducible_and_greedy_is_deterministic(tiny_model):
    prompts = [[1, 5, 6], [1, 7]]
    kw = dict(eos_token_ids={2}, pad_token_id=0)
    a = generate(
        tiny_model, prompts, 4, SamplingParams(max_new_tokens=8), generator=torch.Generator().manual_seed(3), **kw
    )
    b = generate(
        tiny_model, prompts, 4, SamplingParams(max_new_tokens=8), generator=torch.Generator().manual_seed(3), **kw
    )
    assert a.completion_ids == b.completion_ids
    g1 = generate(tiny_model, prompts, 2, SamplingParams(max_new_tokens=8, temperature=0), **kw)
    assert g1.completion_ids[0] == g1.completion_ids[1]  # greedy samples of one prompt agree


def test_stop_strings_end_a_completion(tiny_model):
    decode = lambda ids: "".join("x" if t == 5 else "y" for t in ids)
    ro = generate(
        tiny_model,
        [[1, 5]],
        6,
        SamplingParams(max_new_tokens=10, stop=("x",)),
        eos_token_ids={2},
        pad_token_id=0,
        generator=torch.Generator().manual_seed(0),
        decode=decode,
    )
    for c, r in zip(ro.completion_ids, ro.finish_reasons):
        if r == "stop":
            assert c[-1] == 5 and 5 not in c[:-1]


def test_process_logits_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    # top_k 2 -> renormalised [0.625, 0.375, 0, 0]
    p = process_logits(logits, SamplingParams(top_k=2)).exp()
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0]]), atol=1e-6)
    # top_p 0.7: mass before each token 0, 0.5, 0.8 -> keep the first two
    p = process_logits(logits, SamplingParams(top_p=0.7)).exp()
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0]]), atol=1e-6)
    # min_p 0.2: drop below 0.2 * 0.5 = 0.1 -> keep 0.5, 0.3, 0.15 -> /0.95
    p = process_logits(logits, SamplingParams(min_p=0.2)).exp()
    assert torch.allclose(p, torch.tensor([[0.5, 0.3, 0.15, 0]]) / 0.95, atol=1e-6)


def test_static_cache_decoder_equals_dynamic_cache_path(tiny_model):
    # ragged prompts (left padding), rows finishing at different times (EOS ids 2, 3), greedy and seeded sampling,
    # on both a Llama and a Qwen2 (q/k/v biases) model: the static engine must sample the very same tokens
    prompts = [[1, 5, 6, 7, 8], [1, 9], [1, 3, 4]]
    kw = dict(eos_token_ids={2, 3}, pad_token_id=0)
    for model in (tiny_model, tiny_qwen2()):
        for params in (
            SamplingParams(max_new_tokens=10, temperature=0),
            SamplingParams(max_new_tokens=10),
            SamplingParams(max_new_tokens=10, temperature=0.7, top_p=0.9),
        ):
            a = generate(model, prompts, 4, params, engine="static", generator=torch.Generator().manual_seed(1), **kw)
            b = generate(model, prompts, 4, params, engine="dynamic", generator=torch.Generator().manual_seed(1), **kw)
            assert a.completion_ids == b.completion_ids and a.finish_reasons == b.finish_reasons
            for x, y in zip(a.sampling_logprobs, b.sampling_logprobs):
                assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-5)


def test_static_engine_sampling_logprobs_match_a_full_forward():
    model = tiny_qwen2(seed=3)
    prompts = [[1, 5, 6, 7], [1, 9]]
    ro = generate(
        model,
        prompts,
        3,
        SamplingParams(max_new_tokens=12),
        eos_token_ids={2, 3, 4},
        pad_token_id=0,
        generator=torch.Generator().manual_seed(0),
        engine="static",
    )
    batch = make_token_batch(ro, pad_token_id=0)
    logp, _ = completion_logprobs(model, batch)
    ref = torch.zeros_like(logp)
    for i, lp in enumerate(ro.sampling_logprobs):
        ref[i, : len(lp)] = torch.tensor(lp)
    m = batch.completion_mask
    assert torch.allclose(logp * m, ref * m, atol=1e-4)


def test_engine_auto_falls_back_for_unsupported_models():
    from grpokit.rollout import static

    class Other(torch.nn.Module):
        config = type("C", (), {"model_type": "gpt2"})()

    assert not static.supports(Other())


def test_static_decoder_rotary_table_equals_the_models_rotary_embedding(tiny_model):
    from grpokit.rollout import static

    model = tiny_qwen2(seed=5)
    for m in (tiny_model, model):
        ids = torch.tensor([[0, 0, 1, 5], [1, 2, 3, 4]])
        mask = (ids != 0).long()
        out = m(input_ids=ids, attention_mask=mask, use_cache=True)
        dec = static.StaticDecoder.from_prefill(m, out.past_key_values, mask, 3, max_new_tokens=6)
        pos = torch.tensor([[0], [3], [9], [5], [1], [2]])  # any positions of the rollout, in any order
        x = torch.zeros(6, m.config.hidden_size)
        assert m.model.rotary_emb.rope_type in static.STATIC_ROPE
        table = dec._rotary_at(x, pos)
        assert table.shape == (2, 6, 1, m.config.hidden_size // m.config.num_attention_heads)
        # the same numbers, computed once per rollout (the sine laid out for static.rotate)
        assert torch.equal(table, static.rotary_table(*m.model.rotary_emb(x, pos)))
        cos, sin = m.model.rotary_emb(x, pos)
        h = sin.shape[-1] // 2
        assert torch.equal(table[0], cos) and torch.equal(table[1], torch.cat((sin[..., h:], -sin[..., :h]), -1))


def test_when_finished_rows_leave_the_cache_does_not_change_what_is_sampled(tiny_model, monkeypatch):
    from grpokit.rollout import hf

    assert not hf.compact_due(8, 8) and hf.compact_due(8, 6) and not hf.compact_due(8, 7)  # a quarter of 8 is 2
    assert hf.compact_due(2, 1) and hf.compact_due(64, 48) and not hf.compact_due(64, 49)
    prompts = [[1, 5, 6, 7, 8], [1, 9], [1, 3, 4]]
    runs = []
    for fraction in (0.0, 0.25, 2.0):  # drop at every finish, by quarters, never (until all have finished)
        monkeypatch.setattr(hf, "COMPACT_FRACTION", fraction)
        for engine in ("static", "dynamic"):
            ro = generate(
                tiny_model,
                prompts,
                4,
                SamplingParams(max_new_tokens=12, temperature=0.8),
                eos_token_ids={2, 3},
                pad_token_id=0,
                generator=torch.Generator().manual_seed(2),
                engine=engine,
            )
            runs.append(ro)
    assert len({r.finish_reasons.count("eos") for r in runs}) == 1 and 0 < runs[0].finish_reasons.count("eos") < 12
    for r in runs[1:]:
        assert r.completion_ids == runs[0].completion_ids and r.finish_reasons == runs[0].finish_reasons
        for x, y in zip(r.sampling_logprobs, runs[0].sampling_logprobs):
            assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-5)


def test_graphed_step_math_equals_the_eager_step_on_cpu(tiny_model, monkeypatch):
    """What a CUDA graph replays (column index as a tensor, a fixed attention window with unwritten
    columns masked) computes the eager step's logits and writes the same cache; checked on CPU,
    where no graph is needed to run it."""
    from grpokit.rollout import static
    from grpokit.rollout.static import StaticDecoder

    ids = torch.tensor([[0, 5, 6, 7], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        outs = [
            tiny_model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True).past_key_values
            for _ in range(2)
        ]
        eager = StaticDecoder.from_prefill(tiny_model, outs[0], mask, 2, 6)
        monkeypatch.setattr(static, "graphable", lambda model, device: True)  # graph-mode cache on CPU
        fixed = StaticDecoder.from_prefill(tiny_model, outs[1], mask, 2, 6, graphs=True)
        S, W = eager.keys[0].shape[2], ids.shape[1]
        assert fixed.graphs and all(bool((k[:, :, W:] == 0).all()) for k in fixed.keys + fixed.values)  # no NaN garbage
        tok, p = torch.tensor([7, 8, 9, 10]), pos[:, -1:].repeat_interleave(2, 0) + 1
        for _ in range(6):
            want = eager.step(tok, p)
            got = fixed._forward(tok, p, torch.tensor([fixed.t]), S)  # window: the whole cache
            fixed.t += 1
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            tok, p = want.argmax(-1), p + 1
        for k_eager, k_fixed in zip(eager.keys, fixed.keys):
            torch.testing.assert_close(k_fixed, k_eager)


def test_sdpa_attention_in_the_static_step_samples_what_the_matmul_attention_does(tiny_model, monkeypatch):
    # rollout/static.py ATTENTION="sdpa" (torch's fused attention, grouped-query heads) against the
    # two-matmul attention: the same tokens and logprobs, ragged prompts, rows finishing at different times
    from grpokit.rollout import static

    prompts = [[1, 5, 6, 7, 8], [1, 9], [1, 3, 4]]
    kw = dict(eos_token_ids={2, 3}, pad_token_id=0, engine="static")
    for model in (tiny_model, tiny_qwen2()):
        params = SamplingParams(max_new_tokens=10, temperature=0.7, top_p=0.9)
        a = generate(model, prompts, 4, params, generator=torch.Generator().manual_seed(1), **kw)
        monkeypatch.setattr(static, "ATTENTION", "sdpa")
        b = generate(model, prompts, 4, params, generator=torch.Generator().manual_seed(1), **kw)
        monkeypatch.setattr(static, "ATTENTION", "matmul")
        assert a.completion_ids == b.completion_ids and a.finish_reasons == b.finish_reasons
        for x, y in zip(a.sampling_logprobs, b.sampling_logprobs):
            assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-5)


def test_repetition_penalty_is_transformers_on_fixed_tensors():
    from transformers import RepetitionPenaltyLogitsProcessor

    from grpokit.rollout.sampling import penalize_repetition

    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0], [-2.0, 4.0, 1.0, 0.0]])
    seen = torch.tensor([[True, True, False, False], [True, False, False, True]])
    # row 0: 2 / 2 = 1 (positive: divided), -1 * 2 = -2 (negative: multiplied); row 1: -2 * 2 = -4, 0 * 2 = 0
    assert penalize_repetition(logits, seen, 2.0).tolist() == [[1.0, -2.0, 0.5, 3.0], [-4.0, 4.0, 1.0, 0.0]]
    ids = torch.tensor([[0, 1, 1], [3, 0, 3]])  # the same seen tokens as ids (repeats count once)
    for penalty in (2.0, 1.3, 0.8):
        hf = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
        assert torch.allclose(penalize_repetition(logits, seen, penalty), hf)
        # then temperature, as transformers' warpers after the processor
        p = SamplingParams(temperature=0.7, repetition_penalty=penalty)
        assert torch.allclose(process_logits(logits, p, seen), torch.log_softmax(hf / 0.7, dim=-1), atol=1e-6)
    assert torch.equal(process_logits(logits, SamplingParams(), seen), torch.log_softmax(logits, dim=-1))  # 1.0: off


def test_greedy_with_repetition_penalty_equals_transformers_generate_on_both_engines(tiny_model):
    prompt = [1, 5, 6, 5, 7]
    hf = tiny_model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=10,
        repetition_penalty=1.8,
        eos_token_id=2,
        pad_token_id=0,
    )[0, len(prompt) :].tolist()
    plain = generate(
        tiny_model, [prompt], 1, SamplingParams(max_new_tokens=10, temperature=0), eos_token_ids={2}, pad_token_id=0
    )
    for engine in ("static", "dynamic"):
        ro = generate(
            tiny_model,
            [prompt],
            2,
            SamplingParams(max_new_tokens=10, temperature=0, repetition_penalty=1.8),
            eos_token_ids={2},
            pad_token_id=0,
            engine=engine,
        )
        assert ro.completion_ids == [hf, hf], engine
    assert plain.completion_ids[0] != hf  # the penalty changed what greedy decoding picks (so the test can fail)


def test_sampling_logprobs_with_repetition_penalty_are_the_penalised_distributions(tiny_model):
    prompts = [[1, 5, 6, 7], [1, 9]]  # ragged: left padding must not count as seen
    params = SamplingParams(max_new_tokens=8, temperature=0.7, repetition_penalty=1.5)
    for engine in ("static", "dynamic"):
        ro = generate(
            tiny_model,
            prompts,
            3,
            params,
            eos_token_ids={2, 3},
            pad_token_id=0,
            generator=torch.Generator().manual_seed(0),
            engine=engine,
        )
        for i, (comp, lps) in enumerate(zip(ro.completion_ids, ro.sampling_logprobs)):
            prompt = prompts[i // 3]
            with torch.no_grad():
                logits = tiny_model(torch.tensor([prompt + comp])).logits[0, len(prompt) - 1 : -1]  # (T, V)
            for t, tok in enumerate(comp):
                seen = torch.zeros(1, logits.shape[-1], dtype=torch.bool)
                seen[0, prompt + comp[:t]] = True
                expected = process_logits(logits[t : t + 1], params, seen)[0, tok].item()
                assert abs(lps[t] - expected) < 1e-4, (engine, i, t)


def test_a_hybrid_cache_that_cannot_copy_rows_prefills_each_sample(monkeypatch):
    """NemotronH's Mamba layers (transformers' LinearAttentionLayer) can neither repeat nor drop cache
    rows; generate() then prefills every sample and keeps finished rows (fed padding) in the cache."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    from grpokit.rollout import hf as hf_mod

    torch.manual_seed(0)
    cfg = NemotronHConfig(
        vocab_size=40,
        hidden_size=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        layers_block_type=["mamba", "attention"],
        mamba_num_heads=8,
        mamba_head_dim=4,
        mamba_n_groups=1,
        ssm_state_size=16,
        mamba_d_conv=4,
        mamba_expand=2,
        use_mamba_kernels=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = NemotronHForCausalLM(cfg).eval()
    params = hf_mod.SamplingParams(max_new_tokens=4, temperature=0.0)  # greedy: every sample of a prompt is the same
    prompts = [[5, 6, 7], [8, 9]]  # unequal lengths: left padding in the shared prefill
    cache_rows = []
    real = hf_mod._row_ops
    monkeypatch.setattr(hf_mod, "_row_ops", lambda c: cache_rows.append(real(c)) or real(c))
    both = hf_mod.generate(model, prompts, 2, params, eos_token_ids={2}, pad_token_id=0, engine="dynamic")
    assert cache_rows == [False]  # the Mamba layer's cache cannot copy rows: the fallback ran
    alone = [
        hf_mod.generate(model, [p], 1, params, eos_token_ids={2}, pad_token_id=0, engine="dynamic").completion_ids[0]
        for p in prompts
    ]
    # rows p*G .. p*G+G-1 are prompt p's: each equals that prompt's greedy completion decoded alone
    assert both.completion_ids == [alone[0], alone[0], alone[1], alone[1]]


def test_one_sample_per_row_draws_what_torch_multinomial_draws():
    # sample_tokens' Gumbel-max (argmax of log p - log q, q ~ Exp(1); argmax of p / q itself without
    # filters) takes the same draws from the generator as torch.multinomial's one-sample path (argmax
    # of p / q), so it picks the same tokens: on Qwen2.5's 151,936-token vocabulary, and under each
    # filter on a smaller one
    from grpokit.rollout.sampling import sample_tokens

    g = torch.Generator().manual_seed(0)
    for rows, vocab, params in (
        (64, 151_936, SamplingParams()),
        (512, 2048, SamplingParams(temperature=0.7, top_p=0.9)),
        (512, 2048, SamplingParams(top_k=50, min_p=0.05)),
    ):
        logits = torch.randn(rows, vocab, generator=g) * 3
        tok, tok_logp = sample_tokens(logits, params, torch.Generator().manual_seed(5))
        logp = process_logits(logits, params)
        want = torch.multinomial(logp.exp(), 1, generator=torch.Generator().manual_seed(5))[:, 0]
        assert torch.equal(tok, want)
        if params == SamplingParams():  # log(softmax) where the filters' path gathers log_softmax: equal to rounding
            assert torch.allclose(tok_logp, logp.gather(1, want[:, None])[:, 0], atol=1e-6, rtol=0)
        else:
            assert torch.equal(tok_logp, logp.gather(1, want[:, None])[:, 0])
        assert torch.isfinite(tok_logp).all()  # filtered tokens (-inf) are never drawn


def test_nan_logits_stop_the_rollout_with_one_sentence(tiny_model):
    broken = copy.deepcopy(tiny_model)
    with torch.no_grad():
        broken.lm_head.weight[3] = float("nan")
    for engine in ("static", "dynamic"):
        with pytest.raises(FloatingPointError, match=r"log-probabilities are NaN \(completion 0, token 0\)"):
            generate(
                broken,
                [[1, 5, 6]],
                2,
                SamplingParams(max_new_tokens=4),
                eos_token_ids={2},
                pad_token_id=0,
                engine=engine,
            )


@pytest.mark.parametrize("engine", ["static", "dynamic"])
@pytest.mark.parametrize("fraction", [0.0, 0.25, 2.0])
def test_queuing_the_next_step_before_reading_the_tokens_samples_the_same(tiny_model, monkeypatch, engine, fraction):
    """AHEAD_DEVICES (CUDA by default) queue step t+1 before the host reads step t's tokens; rows that
    finish leave one step later. Forced on the CPU, every token, log-probability and finish reason
    equals the in-order loop's: with rows finishing by EOS and by stop string, a repetition penalty,
    and finished rows dropped at every finish, by quarters, or never."""
    from grpokit.rollout import hf

    monkeypatch.setattr(hf, "COMPACT_FRACTION", fraction)
    prompts = [[1, 5, 6, 7, 8], [1, 9], [1, 3, 4]]
    decode = lambda ids: "".join(chr(97 + i % 26) for i in ids)
    steps, real = [], hf._feed
    monkeypatch.setattr(hf, "_feed", lambda *a: steps.append(1) or real(*a))
    runs = []
    for ahead in ((), ("cpu",)):
        monkeypatch.setattr(hf, "AHEAD_DEVICES", ahead)
        steps.clear()
        ro = generate(
            tiny_model,
            prompts,
            4,
            SamplingParams(max_new_tokens=12, temperature=0.8, stop=("qq",), repetition_penalty=1.3),
            eos_token_ids={2, 3},
            pad_token_id=0,
            generator=torch.Generator().manual_seed(2),
            decode=decode,
            engine=engine,
        )
        runs.append((ro, len(steps)))
    (inorder, n_in), (ahead_ro, n_ahead) = runs
    reasons = inorder.finish_reasons
    assert {"eos", "stop", "length"} <= set(reasons)
    assert ahead_ro.completion_ids == inorder.completion_ids and ahead_ro.finish_reasons == reasons
    assert ahead_ro.sampling_logprobs == inorder.sampling_logprobs or all(
        torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-6)
        for x, y in zip(ahead_ro.sampling_logprobs, inorder.sampling_logprobs)
    )
    # some row ran to the 12-token limit, so neither loop stopped early; the last step is never fed
    assert n_in == n_ahead == 11


def test_running_ahead_feeds_one_step_more_when_every_row_finishes_early(tiny_model, monkeypatch):
    from grpokit.rollout import hf

    counts = []
    real = hf._feed
    for ahead in ((), ("cpu",)):
        monkeypatch.setattr(hf, "AHEAD_DEVICES", ahead)
        steps = []
        monkeypatch.setattr(hf, "_feed", lambda *a, s=steps: s.append(1) or real(*a))
        ro = generate(
            tiny_model,
            [[1, 5, 6]],
            2,
            SamplingParams(max_new_tokens=20, temperature=0.0),
            eos_token_ids=set(range(tiny_model.config.vocab_size)),  # every token ends the row
            pad_token_id=0,
            engine="static",
        )
        assert [len(c) for c in ro.completion_ids] == [1, 1]
        counts.append(len(steps))
    assert counts == [0, 1]  # in order: nothing fed after the first token; ahead: the one queued step
