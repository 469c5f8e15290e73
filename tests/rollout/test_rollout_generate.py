"""rollout.engine=generate: transformers' model.generate as grpokit's stage 2 (beam search and the
other GenerationConfig options TRL users pass in generation_kwargs)."""

import json

import pytest
import torch

from grpokit.config import Config, ConfigError
from grpokit.rollout.hf import SamplingParams, generate
from grpokit.rollout.hf_generate import completions, generation_config
from grpokit.validation import validate


def test_greedy_generate_engine_equals_the_dynamic_loop(tiny_model):
    # greedy decoding has one answer per prompt: generate() on the left-padded, G-times repeated prompts
    # must give the dynamic loop's tokens and finish reasons row for row (ragged prompts: 5, 2 and 3
    # tokens, so two of them are padded; EOS ids 2 and 3 end rows at different steps)
    prompts = [[1, 5, 6, 7, 8], [1, 9], [1, 3, 4]]
    kw = dict(eos_token_ids={2, 3}, pad_token_id=0)
    params = SamplingParams(max_new_tokens=10, temperature=0)
    a = generate(tiny_model, prompts, 2, params, engine="generate", **kw)
    b = generate(tiny_model, prompts, 2, params, engine="dynamic", **kw)
    assert a.completion_ids == b.completion_ids and a.finish_reasons == b.finish_reasons
    assert a.group_size == 2 and len(a.completion_ids) == 6 and a.prompt_ids == prompts
    # no sampling logprobs: zeros, one per token (tis.sampled_rows reads such a row as unscored)
    assert a.sampling_logprobs == [[0.0] * len(c) for c in a.completion_ids]
    # the single unpadded prompt straight through transformers agrees too
    direct = tiny_model.generate(
        torch.tensor([prompts[1]]), do_sample=False, max_new_tokens=10, eos_token_id=[2, 3], pad_token_id=0
    )[0, 2:].tolist()
    assert a.completion_ids[2] == direct[: len(a.completion_ids[2])]


def test_completions_cut_at_eos_or_stop_string_as_the_other_engines():
    # eos {2}; a row padded with 0 after its EOS keeps the EOS; a row without EOS ends by length;
    # stop "cd": decode maps id i to chr(ord('a') + i), so ids 2, 3 spell "cd" and the row ends after id 3
    decode = lambda ids: "".join(chr(ord("a") + i) for i in ids)  # noqa: E731
    rows = [[5, 6, 2, 0, 0], [5, 6, 7, 8, 9], [4, 3, 5, 2, 0], [7, 2, 3, 0, 0]]
    tokens, reasons = completions(rows, {2}, ("cd",), decode)
    assert tokens == [[5, 6, 2], [5, 6, 7, 8, 9], [4, 3, 5, 2], [7, 2]]
    assert reasons == ["eos", "length", "eos", "eos"]  # "cd" in the last row only after its EOS: the EOS wins
    tokens, reasons = completions([[4, 2, 3, 5, 6]], {9}, ("cd",), decode)  # "ecd": the stop completes at id 3
    assert tokens == [[4, 2, 3]] and reasons == ["stop"]


def test_generation_config_passes_every_sampling_setting_explicitly_and_adds_the_kwargs():
    cfg = generation_config(
        SamplingParams(max_new_tokens=7, temperature=0.7, top_k=0, top_p=1.0), {"num_beams": 2}, {2, 3}, 0
    )
    assert cfg.do_sample and cfg.temperature == 0.7 and cfg.num_beams == 2 and cfg.max_new_tokens == 7
    # off, said in transformers' own words: left None, generate would take the model's generation_config.json
    # values, else its default top_k 50 (the hunter's repro drew 50 distinct tokens of 500 where 270 were due)
    assert cfg.top_k == 0 and cfg.top_p == 1.0 and cfg.repetition_penalty == 1.0
    assert cfg.min_p is None  # transformers has no other "off" for min-p: only_given_settings keeps it unfilled
    assert cfg.eos_token_id == [2, 3] and cfg.num_return_sequences == 1
    on = generation_config(SamplingParams(top_k=20, top_p=0.8, min_p=0.05, repetition_penalty=1.1), {}, {2}, 0)
    assert (on.top_k, on.top_p, on.min_p, on.repetition_penalty, on.num_beams) == (20, 0.8, 0.05, 1.1, 1)
    greedy = generation_config(SamplingParams(temperature=0), {}, {2}, 0)
    assert not greedy.do_sample and greedy.num_beams == 1  # a model's num_beams cannot turn greedy into beam search
    # temperature 0 (a held-out evaluation, grpokit eval --temperature 0) is greedy whatever the run's
    # generation_kwargs say: before, their do_sample True asked transformers to sample at temperature 0
    greedy = generation_config(SamplingParams(temperature=0), {"do_sample": True, "no_repeat_ngram_size": 2}, {2}, 0)
    assert not greedy.do_sample and greedy.no_repeat_ngram_size == 2
    # TRL users' greedy: do_sample False in generation_kwargs at temperature 0.7; no warper setting is passed
    trl_greedy = generation_config(SamplingParams(temperature=0.7), {"do_sample": False}, {2}, 0)
    assert not trl_greedy.do_sample and trl_greedy.top_k is None


def near_uniform_model():
    """A 500-token model whose next-token distribution is almost flat, with a generation_config.json as a chat
    model's authors write one (Qwen2.5-Instruct's top_k 20, top_p 0.8, repetition_penalty 1.05), plus the
    None-default settings transformers would also fill from it (suppressed tokens, beams)."""
    from helpers.models import tiny_causal_lm

    m = tiny_causal_lm(500, seed=3, eos_token_id=1).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(0.01)
    gc = m.generation_config
    gc.do_sample, gc.temperature, gc.top_k, gc.top_p, gc.repetition_penalty = True, 0.7, 20, 0.8, 1.05
    gc.num_beams, gc.suppress_tokens = 4, list(range(2, 250))
    return m


def test_the_models_generation_config_does_not_change_what_generate_samples():
    m = near_uniform_model()
    own = m.generation_config
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=1, temperature=1.0, top_k=0)
    ro = generate(
        m,
        [[5, 6, 7]],
        400,
        params,
        eos_token_ids={1},
        pad_token_id=0,
        engine="generate",
        generator=g,
        generation_kwargs={"no_repeat_ngram_size": 3},
    )
    first = [c[0] for c in ro.completion_ids]
    # 400 draws from ~500 equally likely tokens: about 500 * (1 - exp(-400/500)) = 275 distinct ones are due.
    # The model's top_k 20 would allow 20 at most (transformers' default top_k 50: 50 at most)
    assert len(set(first)) > 200
    # its suppress_tokens (ids 2-249, about half the vocabulary) are not applied: about 200 draws land there
    assert sum(2 <= t < 250 for t in first) > 100
    assert m.generation_config is own and own.top_k == 20  # put back after the call


def test_a_lora_models_own_generation_config_is_set_aside_too():
    from peft import LoraConfig, get_peft_model

    m = get_peft_model(near_uniform_model(), LoraConfig(r=2, target_modules=["q_proj"]))
    base = m.get_base_model().generation_config
    g = torch.Generator().manual_seed(0)
    ro = generate(
        m,
        [[5, 6, 7]],
        200,
        SamplingParams(max_new_tokens=1, top_k=0),
        eos_token_ids={1},
        pad_token_id=0,
        engine="generate",
        generator=g,
    )
    # 200 draws of ~500 tokens: about 500 * (1 - exp(-200/500)) = 165 distinct; the model's top_k 20 allows 20
    assert len({c[0] for c in ro.completion_ids}) > 100
    assert m.get_base_model().generation_config is base


def test_seeded_sampling_repeats_and_leaves_the_global_rng_alone(tiny_model):
    prompts = [[1, 5, 6], [1, 9]]
    kw = dict(eos_token_ids={2}, pad_token_id=0, engine="generate")
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a = generate(
        tiny_model, prompts, 3, SamplingParams(max_new_tokens=8), generator=torch.Generator().manual_seed(4), **kw
    )
    assert torch.equal(torch.random.get_rng_state(), state)  # generate() drew inside fork_rng
    b = generate(
        tiny_model, prompts, 3, SamplingParams(max_new_tokens=8), generator=torch.Generator().manual_seed(4), **kw
    )
    assert a.completion_ids == b.completion_ids


def test_beam_search_run_of_two_steps_trains(tiny_model_dir, tmp_path):
    from grpokit.train import Trainer
    from helpers.runs import ROWS, likes_a, tiny_cfg

    cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{"rollout.engine": "generate"})
    cfg.data.dataset = ""
    cfg.rollout.generation_kwargs = {"num_beams": 2, "length_penalty": -0.1}
    tr = Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=ROWS[:2], quiet=True)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    assert tr.train()["steps"] == 2
    changed = [n for n, p in tr.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert len(changed) == len(before)
    # generate() records no sampling log-probs: no mismatch/* figure (it had logged 0.0, a mismatch nobody measured)
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"reward"' in x]
    assert len(steps) == 2 and not [k for s in steps for k in s if k.startswith("mismatch/")]


@pytest.mark.parametrize(
    "over, message",
    [
        ({"engine": "beam"}, r"^rollout.engine='?beam'? "),
        (
            {"generation_kwargs": {"num_beams": 2}},
            r"^rollout.generation_kwargs=\{'num_beams': 2\} is read only by rollout.engine=generate",
        ),
        (
            {"engine": "generate", "generation_kwargs": {"temperature": 0.5}},
            r"^rollout.generation_kwargs keys \['temperature'\] are set elsewhere",
        ),
        ({"engine": "generate", "async_staleness": 1}, r"^rollout.engine=generate records no sampling logprobs"),
        ({"engine": "static", "backend": "vllm"}, r"^rollout.engine=static picks a decode loop of rollout.backend=hf"),
    ],
)
def test_bad_engine_settings_get_one_sentence(over, message):
    cfg = Config()
    for k, v in over.items():
        setattr(cfg.rollout, k, v)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        # before: both accepted, kept by GenerationConfig as attributes nothing reads, the run sampled plainly
        (
            {"num_beam": 4},
            "key 'num_beam' is not a setting of transformers' GenerationConfig (generate() would "
            "ignore it); did you mean 'num_beams'?",
        ),
        (
            {"no_repeat_ngram_size": 1, "no_repeat_ngram": 1},
            "key 'no_repeat_ngram' is not a setting of transformers' "
            "GenerationConfig (generate() would ignore it); did you mean 'no_repeat_ngram_size'?",
        ),
        (
            {"zzz": 1},
            "key 'zzz' is not a setting of transformers' GenerationConfig (generate() would ignore it); see "
            "transformers' GenerationConfig for its settings",
        ),
    ],
)
def test_a_generation_kwargs_key_generate_does_not_read_is_refused_naming_the_closest(kwargs, message):
    """Each key must be an attribute of a default transformers GenerationConfig(); the others are refused with the
    closest valid name. Valid keys (no_repeat_ngram_size, num_beams, length_penalty) are accepted."""
    from grpokit.config import apply_overrides

    cfg = apply_overrides(Config(), ["rollout.engine=generate"])
    cfg.rollout.generation_kwargs = kwargs
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value) == f"rollout.generation_kwargs {message}"
    cfg.rollout.generation_kwargs = {"no_repeat_ngram_size": 1, "num_beams": 2, "length_penalty": -0.1}
    validate(cfg)
