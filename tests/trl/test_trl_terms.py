"""Under grpokit.trl a sentence from inside the run names TRL's arguments, not the grpokit fields they were
mapped to (trl/mapping.py TRL_NAMES, in config.base.named_as around the run's building)."""

from __future__ import annotations

import socket

import pytest
from datasets import Dataset

from grpokit.config.base import named_as
from grpokit.config.sections import ConfigError
from grpokit.trl import GRPOConfig, GRPOTrainer
from grpokit.trl.mapping import MAPPING, TRL_NAMES


def test_each_name_is_the_argument_whose_rule_sets_the_field():
    for field, arg in TRL_NAMES.items():
        assert any(field in rule.fields and arg in rule.args for rule in MAPPING), (field, arg)


def test_an_unreachable_vllm_server_names_vllm_server_base_url(chat_model, tmp_path):
    """Before: "rollout.vllm_url: no vLLM server became ready ..., or fix rollout.vllm_url", a field the
    script never wrote."""
    with socket.socket() as s:  # a port free a moment ago: nothing listens on 127.0.0.1 there now
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    args = GRPOConfig(
        str(tmp_path / "out"),
        use_cpu=True,
        num_generations=2,
        per_device_train_batch_size=2,
        report_to="none",
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_server_timeout=0.3,
        max_completion_length=8,  # room in the tiny model's context (data/prompt_length.py checks it first)
    )
    trainer = GRPOTrainer(
        chat_model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 4),
        args=args,
    )
    with pytest.raises(ConfigError) as e:
        trainer.train()
    said = str(e.value)
    assert said.startswith(f"vllm_server_base_url: no vLLM server became ready at {url} within 0.3 s")
    assert "(vllm_server_timeout;" in said and said.endswith("or fix vllm_server_base_url")
    assert "rollout." not in said


def test_other_sentences_pass_unchanged():
    with pytest.raises(ConfigError, match=r"^model\.dtype='x' is not valid$"):
        with named_as(TRL_NAMES):
            raise ConfigError("model.dtype='x' is not valid")


def test_only_whole_field_names_are_renamed():
    # rollout.vllm_url inside a longer name is another field: kept (before, str.replace made the first
    # "vllm_server_base_urls" and the second "my.vllm_server_base_url"); the whole name is renamed.
    with pytest.raises(ConfigError) as e, named_as(TRL_NAMES):
        raise ConfigError("rollout.vllm_urls and my.rollout.vllm_url differ from rollout.vllm_url")
    assert str(e.value) == "rollout.vllm_urls and my.rollout.vllm_url differ from vllm_server_base_url"
