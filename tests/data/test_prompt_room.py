"""A prompt within the model's context but without room for its completion (data/prompt_length.py): refused at
start for a model whose positions are a learned table (GPT-2's wpe: before, `internal fault (IndexError)` mid-run
under grpokit train and a raw IndexError under grpokit.trl, as under TRL), warned about once for a rotary one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpokit.config.sections import Config, ConfigError
from grpokit.data.prompt_length import (
    Room,
    check_prompt_lengths,
    check_room,
    completion_room,
    learned_positions,
    overrun,
)
from grpokit.types import Prompt


def _p(n: int) -> Prompt:
    return Prompt(text="t" * n, ids=list(range(n)))


def _model(**config):
    return SimpleNamespace(config=SimpleNamespace(**config))


def _gpt2(n_positions: int = 64):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_positions=n_positions, n_embd=8, n_layer=1, n_head=2, vocab_size=32))


def test_learned_positions_are_the_loaded_models_table():
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MambaConfig,
        MambaForCausalLM,
        OPTConfig,
        OPTForCausalLM,
        XGLMConfig,
        XGLMForCausalLM,
    )  # fmt: skip

    tiny = dict(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2)
    assert learned_positions(_gpt2())  # transformer.wpe: nn.Embedding(64, 8), 64 = n_positions
    opt = OPTConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, ffn_dim=8,
                    word_embed_proj_dim=8, max_position_embeddings=64)  # fmt: skip
    assert learned_positions(OPTForCausalLM(opt))  # decoder.embed_positions: 64 + OPT's offset 2 = 66 rows
    assert not learned_positions(LlamaForCausalLM(LlamaConfig(intermediate_size=8, **tiny)))  # rotary: no table
    # before: both refused as learned (no rotary key in their configs); XGLM's positions are sinusoidal (computed,
    # not an nn.Embedding), Mamba has no positions at all
    xglm = XGLMConfig(vocab_size=32, d_model=8, num_layers=1, attention_heads=2, ffn_dim=8, max_position_embeddings=64)
    assert not learned_positions(XGLMForCausalLM(xglm))
    assert not learned_positions(MambaForCausalLM(MambaConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1)))
    assert not learned_positions(SimpleNamespace(config=OPTConfig()))  # a config alone: no table to see
    assert not learned_positions(SimpleNamespace())  # no config: nothing known


def test_a_prompt_without_room_for_its_completion_is_refused_for_learned_positions():
    # 60 + 16 = 76 > 64; a prompt of 48 tokens would leave the 16: 64 - 16 = 48
    gpt2 = _gpt2(64)
    with pytest.raises(ConfigError) as e:
        check_prompt_lengths(Config(), gpt2, [_p(10), _p(60)], [_p(20)], Room(16, "rollout.max_new_tokens"))
    assert str(e.value) == (
        "the longest training prompt (row 1, 60 tokens) and rollout.max_new_tokens=16 make 76 tokens, more than the "
        "model's context of 64, whose positions are a learned table with no row past it; shorten the prompts or "
        "lower rollout.max_new_tokens, or cut them with rollout.truncate_prompts=true and rollout.max_prompt_tokens=48"
    )
    # exactly full: 48 + 16 = 64 fits; the held-out prompts are measured too (50 + 16 = 66)
    check_prompt_lengths(Config(), gpt2, [_p(48)], [], Room(16, "rollout.max_new_tokens"))
    with pytest.raises(ConfigError, match=r"^the longest evaluation prompt \(row 0, 50 tokens\)"):
        check_prompt_lengths(Config(), gpt2, [_p(48)], [_p(50)], Room(16, "rollout.max_new_tokens"))
    # cut to the limit the sentence names, the prompts fit: 60 -> its last 48 tokens
    cfg = Config()
    cfg.rollout.truncate_prompts, cfg.rollout.max_prompt_tokens = True, 48
    kept, _, cut = check_prompt_lengths(cfg, gpt2, [_p(60)], [], Room(16, "rollout.max_new_tokens"))
    assert cut == 1 and kept[0].ids == list(range(12, 60))


def test_a_rotary_model_gets_one_warning_and_runs(caplog):
    llama = _model(max_position_embeddings=64, rope_parameters={"rope_type": "default"})
    prompts, _, _ = check_prompt_lengths(Config(), llama, [_p(60)], [_p(61)], Room(16, "rollout.max_new_tokens"))
    assert len(prompts) == 1
    warned = [r.getMessage() for r in caplog.records if "context" in r.getMessage()]
    assert warned == [  # one line for both sets, naming the longest (61 + 16 = 77)
        "grpokit: warning: the longest evaluation prompt (row 0, 61 tokens) and rollout.max_new_tokens=16 make 77 "
        "tokens, more than the model's context of 64; this model's positions run past it, but it was not trained "
        "there, so the completions that long may degrade; shorten the prompts or lower rollout.max_new_tokens, or cut "
        "them with rollout.truncate_prompts=true and rollout.max_prompt_tokens=48"
    ]


def test_a_context_the_model_does_not_state_checks_nothing():
    check_room({"training": [_p(1000)]}, 0, Room(16, "rollout.max_new_tokens"), "learned")


def test_under_vllm_the_server_refuses_and_the_colocated_engine_cuts(caplog):
    # 60 + 16 = 76 > 64: the vLLM server answers such a request with HTTP 400 (the run would end mid-step), the
    # colocated engine stops the completion at max_model_len; before, both were "runs past it, may degrade"
    rotary = _model(max_position_embeddings=64, rope_parameters={"rope_type": "default"})
    cfg = Config()
    cfg.rollout.backend = "vllm_server"
    assert overrun(cfg, rotary) == "vllm_server"
    with pytest.raises(ConfigError, match=r"more than the model's context of 64, which the vLLM server refuses \(HTTP"):
        check_prompt_lengths(cfg, rotary, [_p(60)], [], Room(16, "rollout.max_new_tokens"))
    cfg.rollout.backend, cfg.rollout.vllm_max_model_len = "vllm", 70  # 60 + 16 = 76 > 70, the engine's context
    check_prompt_lengths(cfg, rotary, [_p(60)], [], Room(16, "rollout.max_new_tokens"))
    assert "make 76 tokens, more than the model's context of 70; vLLM stops a completion at its max_model_len" in (
        caplog.text
    )
    assert overrun(cfg, _gpt2()) == "learned" and overrun(cfg, rotary, engine="hf") == "runs_past"


def test_uncapped_episodes_are_refused_for_a_learned_table():
    # env.max_episode_tokens=0 and 3 turns: before, the room was max_new_tokens=16 alone (10 + 16 <= 64 passed)
    # and episodes could overrun the table mid-run; now the room is unbounded: refused, naming the cap 64 - 10 = 54
    cfg = Config()
    cfg.env.max_turns, cfg.env.max_episode_tokens = 3, 0
    room = completion_room(cfg, 16, multi_turn=True)
    assert room.unbounded and room.setting == "env.max_episode_tokens"
    with pytest.raises(ConfigError) as e:
        check_prompt_lengths(cfg, _gpt2(64), [_p(10)], [], room)
    assert str(e.value) == (
        "env.max_episode_tokens=0 puts no cap on an episode of several turns, so one can run past the model's context "
        "of 64, whose positions are a learned table with no row past it; set env.max_episode_tokens to at most 54 "
        "(the context less the longest training prompt, row 0, 10 tokens)"
    )
    check_prompt_lengths(cfg, _model(max_position_embeddings=64), [_p(10)], [], room)  # no table: runs, unchecked


def test_the_room_of_a_multi_turn_episode_is_its_token_cap():
    cfg = Config()
    cfg.rollout.max_new_tokens, cfg.env.max_turns, cfg.env.max_episode_tokens = 16, 3, 100
    assert str(completion_room(cfg, 16, multi_turn=False)) == "rollout.max_new_tokens=16"  # one plain turn
    assert str(completion_room(cfg, 16, multi_turn=True)) == "env.max_episode_tokens=100"  # tools, results, turns
    cfg.env.max_turns = 1  # one turn, even with tools: its max_new_tokens
    assert str(completion_room(cfg, 16, multi_turn=True)) == "rollout.max_new_tokens=16"
    cfg.env.max_turns, cfg.env.max_episode_tokens = 3, 8  # a cap below one turn: the turn is sampled whole first
    assert str(completion_room(cfg, 16, multi_turn=True)) == "rollout.max_new_tokens=16"
    assert str(completion_room(cfg, 16, multi_turn=False, eval_flag=True)) == "--max-new-tokens 16"
