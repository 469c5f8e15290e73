"""The chat template around tool calls: the tokens after a tool result are the template's own, rendered with the
run's chat_template_kwargs (as TRL's _get_tool_suffix_ids passes them), so a later turn's assistant header is the
first turn's; a template that cannot give them (it does not keep the conversation's prefix) is found before the
first step: a known one (Qwen3's) gets grpokit's rewrite for the suffix, as TRL swaps in its training template,
any other falls back to tags under auto or is refused."""

import logging
import types

import pytest

from grpokit.config import Config, ConfigError
from grpokit.config.io import apply_overrides
from grpokit.data import render_prompt
from grpokit.env.parse import template_suffix_ids
from grpokit.env.templates import prefix_fault, suffix_keywords
from grpokit.rollout.hf import SamplingParams
from grpokit.train.episode_setup import episode_runner
from grpokit.types import Prompt, Rollout
from helpers.episodes import HERMES, chat_tokenizer

# HERMES with Qwen3's switch: enable_thinking=False writes an empty think block into the generation prompt
THINKING = HERMES.replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}{% endif %}",
)
TOOL_MESSAGE = [{"role": "tool", "name": "shout", "content": "HI"}]


def shout(text: str) -> str:
    """Shout.

    Args:
        text: what to shout.
    """
    return text.upper()


def thinking_tokenizer():
    tok = chat_tokenizer()
    tok.chat_template = THINKING
    return tok


def test_the_suffix_after_a_tool_result_takes_the_template_kwargs():
    tok = thinking_tokenizer()
    # stand-in head: "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<tool_call>...</tool_call><|im_end|>",
    # cut after its end-of-turn token; the rest of the full rendering is the tool message and the generation prompt
    reply = "\n<|im_start|>user\n<tool_response>HI</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(template_suffix_ids(tok, TOOL_MESSAGE)) == reply
    # enable_thinking=False: the generation prompt after the tool result carries the empty think block, as the
    # first turn's does (before: dropped, the model's second turn started without it)
    no_think = template_suffix_ids(tok, TOOL_MESSAGE, None, enable_thinking=False)
    assert tok.decode(no_think) == reply + "<think></think>"


def test_every_turn_of_a_run_with_chat_template_kwargs_starts_alike():
    cfg = apply_overrides(
        Config(),
        ["env.tool_format=chat_template", "env.max_turns=3", "data.chat_template_kwargs={enable_thinking: false}"],
    )
    tok = thinking_tokenizer()
    runner = episode_runner(cfg, tok, [shout], None)
    assert runner.template_kwargs == {"enable_thinking": False}
    question = [{"role": "user", "content": "go"}]
    text = render_prompt(question, tok, cfg.data, runner.schemas)
    contexts = []
    call = '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'

    def model(ctxs, G, params):
        contexts.extend(tok.decode(c) for c in ctxs)
        outs = [
            tok(call if "<tool_response>" not in tok.decode(c) else "ok", add_special_tokens=False)["input_ids"]
            + [tok.eos_token_id]
            for c in ctxs
        ]
        return Rollout([list(c) for c in ctxs], outs, [[-0.5] * len(o) for o in outs], ["eos"] * len(outs), G)

    runner.run(
        model, [Prompt(text, list(tok(text, add_special_tokens=False)["input_ids"]), {}, question)], 1, SamplingParams()
    )
    header = "<|im_start|>assistant\n<think></think>"
    # turn 1 from the prompt, turn 2 after the tool result: both open with the no-thinking header
    assert len(contexts) == 2 and all(c.endswith(header) for c in contexts)
    assert contexts[1].endswith("<tool_response>HI</tool_response><|im_end|>\n" + header)


def test_the_suffix_is_trls_with_chat_template_kwargs():
    pytest.importorskip("trl")
    from trl import GRPOTrainer

    tok = thinking_tokenizer()
    kw = {"enable_thinking": False}
    # TRL's method on a stand-in carrying the attributes it reads
    fake = types.SimpleNamespace(
        _is_vlm=False, processing_class=tok, chat_template=None, chat_template_kwargs=kw, _tokenizer=tok
    )
    assert template_suffix_ids(tok, TOOL_MESSAGE, None, **kw) == GRPOTrainer._get_tool_suffix_ids(fake, TOOL_MESSAGE)


# ---------------------------------------------------------------- templates that do not keep the prefix

# A short template in Qwen3's manner: the think block only in the last assistant message (or one with reasoning),
# so the tool-calling turn is rendered with it alone and without it once a tool message follows
LAST_TURN_THINK = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% set reasoning_content = m.reasoning_content or '' %}<|im_start|>assistant\n"
    "{% if loop.last or (not loop.last and reasoning_content) %}<think>{{ reasoning_content }}</think>{% endif %}"
    '{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{"name": "{{ c.function.name }}"}</tool_call>'
    "{% endfor %}<|im_end|>\n{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The same flaw written another way: grpokit knows no rewrite of it
UNKNOWN = LAST_TURN_THINK.replace("loop.last or (not loop.last and reasoning_content)", "loop.index == loop.length")


def tokenizer_with(template):
    tok = chat_tokenizer()
    tok.chat_template = template
    return tok


def test_a_known_template_that_does_not_keep_the_prefix_gets_grpokits_rewrite_for_the_suffix():
    tok = tokenizer_with(LAST_TURN_THINK)
    assert prefix_fault(tok, {}) == "it does not keep the conversation's prefix when a tool message is added"
    with pytest.raises(ValueError, match="does not keep the conversation's prefix"):  # before: at the first call
        template_suffix_ids(tok, TOOL_MESSAGE)
    keywords, why = suffix_keywords(tok, {"enable_thinking": False})
    assert why == "" and keywords["enable_thinking"] is False
    assert "{% if true %}<think>" in keywords["chat_template"]  # every assistant turn after the query: its block
    suffix = tok.decode(template_suffix_ids(tok, TOOL_MESSAGE, None, **keywords))
    # the original template's own tokens after the assistant turn's end: only that turn's rendering differs
    whole = tok.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": []}, *TOOL_MESSAGE],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert suffix == whole[whole.index("<|im_end|>", whole.index("assistant")) + len("<|im_end|>") :]
    assert suffix == "\n<|im_start|>user\n<tool_response>HI</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_cannot_write_tool_results_is_refused_or_left_before_the_first_step(caplog):
    tok = tokenizer_with(UNKNOWN)
    chat = apply_overrides(Config(), ["env.tool_format=chat_template"])
    with pytest.raises(ConfigError) as e:
        episode_runner(chat, tok, [shout], None)
    assert str(e.value) == (
        "env.tool_format=chat_template but this tokenizer's chat template cannot write the tokens after a tool "
        "call: it does not keep the conversation's prefix when a tool message is added, and grpokit knows no "
        "rewrite of it; use env.tool_format=tags and describe the tools and that format in the prompts, or a chat "
        "template that renders earlier turns alike whatever follows them"
    )
    with caplog.at_level(logging.WARNING, logger="grpokit.env"):
        runner = episode_runner(apply_overrides(Config(), ["env.tool_format=auto"]), tok, [shout], None)
    assert runner.spec.tool_format == "tags"
    (warning,) = [r.getMessage() for r in caplog.records if "cannot write the tokens" in r.getMessage()]
    assert "so episodes use the tags format" in warning
    # the known flaw: chat_template kept, the rewrite for the suffix
    runner = episode_runner(chat, tokenizer_with(LAST_TURN_THINK), [shout], None)
    assert runner.spec.tool_format == "chat_template" and "{% if true %}" in runner.template_kwargs["chat_template"]
    # a template that keeps the prefix: the run's keywords only
    assert episode_runner(chat, thinking_tokenizer(), [shout], None).template_kwargs == {}


def test_a_template_that_writes_the_arguments_as_text_gets_them_as_text():
    # DeepSeek-V3's template concatenates a call's arguments to a string; a dict there is a TypeError
    tok = tokenizer_with(HERMES.replace("{{ c.function.arguments | tojson }}", "{{ '' + c.function.arguments }}"))
    suffix = tok.decode(template_suffix_ids(tok, TOOL_MESSAGE))
    assert suffix == "\n<|im_start|>user\n<tool_response>HI</tool_response><|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
def test_qwen3s_template_gets_trls_suffix(kwargs):
    """Qwen3's own template (TRL ships its text): grpokit's rewrite gives the suffix TRL's training template gives,
    and leaves the prompt's rendering as the original's."""
    pytest.importorskip("trl")
    from trl.chat_template_utils import get_training_chat_template, qwen3_chat_template

    from trl import GRPOTrainer

    tok = tokenizer_with(qwen3_chat_template)
    keywords, why = suffix_keywords(tok, kwargs)
    assert why == "" and "chat_template" in keywords
    fake = types.SimpleNamespace(
        _is_vlm=False,
        processing_class=tok,
        chat_template=get_training_chat_template(tok),
        chat_template_kwargs=kwargs,
        _tokenizer=tok,
    )
    assert template_suffix_ids(tok, TOOL_MESSAGE, None, **keywords) == GRPOTrainer._get_tool_suffix_ids(
        fake, TOOL_MESSAGE
    )
    conversation = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y"},
        {"role": "user", "content": "z"},
    ]
    render = dict(tokenize=False, add_generation_prompt=True, **kwargs)
    assert tok.apply_chat_template(conversation, chat_template=keywords["chat_template"], **render) == (
        tok.apply_chat_template(conversation, **render)
    )
