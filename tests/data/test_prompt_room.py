"""A prompt within the model's context but without room for its completion (data/prompt_length.py): refused at
start for a model whose positions are a learned table (GPT-2's wpe: before, `internal fault (IndexError)` mid-run
under grpokit train and a raw IndexError under grpokit.trl, as under TRL), warned about once for a rotary one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpokit.config.sections import Config, ConfigError
from grpokit.data.prompt_length import Room, check_prompt_lengths, check_room, completion_room, learned_positions
from grpokit.types import Prompt


def _p(n: int) -> Prompt:
    return Prompt(text="t" * n, ids=list(range(n)))


def _model(**config):
    return SimpleNamespace(config=SimpleNamespace(**config))


def test_learned_positions_are_read_from_the_config():
    from transformers import GPT2Config, LlamaConfig, OPTConfig

    assert learned_positions(SimpleNamespace(config=GPT2Config(n_positions=64)))  # wpe: a table of 64 rows
    assert learned_positions(SimpleNamespace(config=OPTConfig()))
    assert not learned_positions(SimpleNamespace(config=LlamaConfig()))  # rope_parameters: computed positions
    assert not learned_positions(_model(max_position_embeddings=64, alibi=True))  # Falcon's ALiBi
    assert not learned_positions(_model(max_position_embeddings=64, rotary_dim=8))  # GPT-J
    assert not learned_positions(_model(max_position_embeddings=64, position_embedding_type="rotary"))
    assert not learned_positions(SimpleNamespace())  # no config: nothing known


def test_a_prompt_without_room_for_its_completion_is_refused_for_learned_positions():
    # 60 + 16 = 76 > 64; a prompt of 48 tokens would leave the 16: 64 - 16 = 48
    gpt2 = _model(max_position_embeddings=64)
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
    check_room({"training": [_p(1000)]}, 0, Room(16, "rollout.max_new_tokens"), learned=True)


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
