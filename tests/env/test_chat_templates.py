"""The chat template around tool calls: the tokens after a tool result are the template's own, rendered with the
run's chat_template_kwargs (as TRL's _get_tool_suffix_ids passes them), so a later turn's assistant header is the
first turn's."""

import types

import pytest

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.data import render_prompt
from grpokit.env.parse import template_suffix_ids
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

    from grpokit.rollout.hf import SamplingParams

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
