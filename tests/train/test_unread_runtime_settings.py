"""Settings whose reader depends on the run, not on the config alone, are warned about once where that is known:
env.* without any tools or environment (tools can be passed in code), train.dist_timeout_s in one process (a
launch's property). Before, both were accepted silently and the run was the same."""

import logging

from grpokit.config import Config, apply_overrides
from grpokit.train import distributed, episode_setup
from helpers.episodes import chat_tokenizer


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def test_episode_settings_without_tools_are_warned_once(caplog):
    """The repro's env.max_turns=1 env.tool_format=tags env.max_episode_tokens=3 env.tool_timeout_s=1: the one-turn
    episode is the sampler's completion as it is, so none of them acts; one warning names them all."""
    cfg = apply_overrides(
        Config(), ["env.max_turns=1", "env.tool_format=tags", "env.max_episode_tokens=3", "env.tool_timeout_s=1"]
    )
    with caplog.at_level(logging.WARNING, logger="grpokit.env"):
        runner = episode_setup.episode_runner(cfg, chat_tokenizer(), None, None)
    assert not runner.multi_turn
    assert caplog.messages == [
        "grpokit: warning: env.max_turns=1, env.max_episode_tokens=3, env.tool_format='tags', env.tool_timeout_s=1.0 "
        "change nothing in this run: its episodes are one plain completion (no env.tools, env.environment, tools or "
        "environment_factory, nor a task with tools); they act in multi-turn episodes only"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grpokit.env"):  # a tool passed in code: they act, no warning
        assert episode_setup.episode_runner(cfg, chat_tokenizer(), [add], None).multi_turn
    assert caplog.messages == []
    with caplog.at_level(logging.WARNING, logger="grpokit.env"):  # the defaults: nothing asked
        episode_setup.episode_runner(Config(), chat_tokenizer(), None, None)
    assert caplog.messages == []


def test_a_process_group_timeout_in_one_process_is_warned(caplog, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with caplog.at_level(logging.WARNING, logger="grpokit.train"):
        ctx = distributed.setup(timeout_s=5)
    assert ctx.world_size == 1
    assert caplog.messages == [
        "grpokit: warning: train.dist_timeout_s=5 changes nothing in this run: it is one process; it bounds a "
        "collective's wait in a process group grpokit joins (torchrun)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grpokit.train"):
        distributed.setup(timeout_s=0)  # torch's default: nothing asked
    assert caplog.messages == []
