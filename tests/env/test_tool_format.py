"""env.tool_format against the tokenizer's chat template: a template that ignores ``tools`` (SmolLM2-Instruct's)
renders a prompt with tools byte for byte like one without, so the model would never see its tools. Under auto
such a template falls back to the tags format with one warning; chat_template set explicitly is refused."""

import logging

import pytest

from grpokit.config import Config, ConfigError
from grpokit.config.io import apply_overrides
from grpokit.env.parse import template_shows_tools
from grpokit.train.episode_setup import tool_format
from helpers.episodes import chat_tokenizer

# SmolLM2-Instruct's template in short: the messages, no word of tools
NO_TOOLS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def blind_tokenizer():
    tok = chat_tokenizer()
    tok.chat_template = NO_TOOLS
    return tok


def cfg(fmt):
    return apply_overrides(Config(), [f"env.tool_format={fmt}"])


def test_a_template_shows_tools_when_the_prompt_with_them_differs():
    assert template_shows_tools(chat_tokenizer())  # the Hermes-style template lists "Tools: probe_tool"
    assert not template_shows_tools(blind_tokenizer())


def test_auto_falls_back_to_tags_with_one_warning(caplog):
    assert tool_format(cfg("auto"), chat_tokenizer(), multi=True) == "chat_template"
    with caplog.at_level(logging.WARNING, logger="grpokit.env"):
        assert tool_format(cfg("auto"), blind_tokenizer(), multi=True) == "tags"
    warnings = [r.getMessage() for r in caplog.records if "does not show tools" in r.getMessage()]
    assert len(warnings) == 1 and "episodes use the tags format" in warnings[0]
    # no tools and no environment: the format is never used, nothing checked or said
    caplog.clear()
    assert tool_format(cfg("auto"), blind_tokenizer(), multi=False) == "chat_template" and not caplog.records


def test_chat_template_set_explicitly_is_refused_when_it_cannot_show_tools():
    with pytest.raises(ConfigError) as e:
        tool_format(cfg("chat_template"), blind_tokenizer(), multi=True)
    assert str(e.value) == (
        "env.tool_format=chat_template but this tokenizer's chat template does not show tools (a prompt rendered "
        "with tools is identical to one without), so the model would never see them; use env.tool_format=tags "
        "and describe the tools in the prompts, or a model whose template renders tools"
    )
    assert tool_format(cfg("tags"), blind_tokenizer(), multi=True) == "tags"
