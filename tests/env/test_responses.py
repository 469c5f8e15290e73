"""Completions as the chat messages TRL parses them into (env/responses.py, reward.convention=trl): a think block
becomes reasoning_content, calls tool_calls (before: the whole text, think block included, was the content)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from datasets import Dataset

from grpokit.env.responses import ResponseParser, chatml_tool_template, completion_parser
from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
from grpokit.rollout.sampling import SamplingParams
from grpokit.types import Prompt, Rollout
from helpers.episodes import chat_tokenizer


def add(a: int, b: int) -> str:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return str(a + b)


SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def _parse(tok, text: str) -> dict:
    parser = ResponseParser(tok, chatml_tool_template(tok), SCHEMAS)
    prefix = tok.apply_chat_template(
        [{"role": "user", "content": "2+3?"}], add_generation_prompt=True, return_dict=False
    )
    return parser(tok(text, add_special_tokens=False)["input_ids"], list(prefix))


@pytest.mark.parametrize(
    "text, message",
    [
        # the think block is split off, the whitespace after </think> and the end-of-turn token dropped
        ("<think>plan</think>  5<|im_end|>", {"role": "assistant", "reasoning_content": "plan", "content": "5"}),
        ("5<|im_end|>", {"role": "assistant", "content": "5"}),  # no think block: no reasoning_content
        # a turn that only calls: content "", the call's arguments as JSON
        (
            f"<think>call</think>{CALL}<|im_end|>",
            {
                "role": "assistant",
                "reasoning_content": "call",
                "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
                "content": "",
            },
        ),
        ("<think>cut sh", {"role": "assistant", "reasoning_content": "cut sh", "content": ""}),  # cut at the limit
        # a call that is no JSON: the turn is its text, as TRL falls back
        ('<tool_call>{"name": "add", "argu</tool_call><|im_end|>', None),
    ],
)
def test_a_turn_is_parsed_as_trl_parses_it(text, message):
    tok = chat_tokenizer()
    got = _parse(tok, text)
    want = message or {"role": "assistant", "content": tok.decode(tok(text)["input_ids"], skip_special_tokens=True)}
    assert got == want


def test_the_template_is_given_only_to_chatml_tool_calls():
    tok = chat_tokenizer()
    assert chatml_tool_template(tok)["start_anchor"] == "<|im_start|>assistant\n"
    assert completion_parser(tok, None, "chat_template") is None  # no tools, no template of its own: text
    assert completion_parser(tok, SCHEMAS, "tags") is None  # grpokit's tag format is not TRL's
    assert completion_parser(tok, SCHEMAS, "chat_template") is not None
    tok.response_template = chatml_tool_template(tok)  # a tokenizer's own template: no tools needed, as TRL
    assert completion_parser(tok, None, "tags").template is tok.response_template
    other = chat_tokenizer()
    other.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"  # no <tool_call>, no ChatML
    assert completion_parser(other, SCHEMAS, "chat_template") is None


def test_each_turn_of_an_episode_is_parsed_after_what_came_before():
    tok = chat_tokenizer()
    runner = EpisodeRunner(EpisodeSpec(max_turns=3, tool_format="chat_template"), tok, tools=[add])
    runner.parse_message = completion_parser(tok, runner.schemas, "chat_template")
    eos = tok.eos_token_id
    question = [{"role": "user", "content": "2+3?"}]
    text = tok.apply_chat_template(question, tools=runner.schemas, add_generation_prompt=True, tokenize=False)

    def model(contexts, G, params):  # calls add, then answers with its result
        said = [
            "<think>need</think>" + CALL if "<tool_response>" not in tok.decode(c) else "<think>ok</think>5"
            for c in contexts
        ]
        outs = [tok(s, add_special_tokens=False)["input_ids"] + [eos] for s in said for _ in range(G)]
        return Rollout([list(c) for c in contexts], outs, [[-0.5] * len(o) for o in outs], ["eos"] * len(outs), G)

    p = Prompt(text, list(tok(text, add_special_tokens=False)["input_ids"]), {}, question)
    messages = runner.run(model, [p], 1, SamplingParams()).episodes[0].messages
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    assert messages == [
        {"role": "assistant", "reasoning_content": "need", "tool_calls": [call], "content": ""},
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "assistant", "reasoning_content": "ok", "content": "5"},  # before: "<think>ok</think>5"
    ]


# ---------------------------------------------------------------- against TRL itself


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    """A model that writes "<think>q</think>7<|im_end|>" under TRL's bundled Qwen3 template (TRL gives that
    template its own response template when tools are passed)."""
    trl = pytest.importorskip("trl")
    from helpers.trl_models import make_chain_model

    template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    return str(
        make_chain_model(tmp_path_factory.mktemp("think"), ["<think>", "q", "</think>", "7", "<|im_end|>"], template)
    )


def lookup(word: str) -> str:
    """Look a word up.

    Args:
        word: the word
    """
    return word.upper()


@pytest.mark.parametrize("backend", ["grpokit.trl", pytest.param("trl", marks=pytest.mark.slow)])
@pytest.mark.parametrize("case", ["tools", "response_template"])
def test_reward_functions_get_reasoning_content_as_under_trl(backend, case, thinking_model, tmp_path):
    from transformers import AutoTokenizer

    from helpers.trl_models import small_args

    mod, seen = importlib.import_module(backend), []

    def record(completions, **kwargs):
        seen.extend(completions)
        return [0.0 for _ in completions]

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd")])
    args = small_args(
        mod.GRPOConfig, tmp_path, max_steps=1, per_device_train_batch_size=2, num_generations=2, report_to="none",
        max_completion_length=12,
    )  # fmt: skip
    kw = {"tools": [lookup]} if case == "tools" else {}
    if case == "response_template":  # a tokenizer that carries its own template (TRL reads it without tools)
        tok = AutoTokenizer.from_pretrained(thinking_model)
        tok.response_template = chatml_tool_template(tok)
        kw["processing_class"] = tok
    mod.GRPOTrainer(thinking_model, reward_funcs=record, args=args, train_dataset=data, **kw).train()
    assert seen[0] == [{"role": "assistant", "reasoning_content": "q", "content": "7"}]


def test_a_call_nesting_past_max_tool_nesting_is_its_text_not_a_crash():
    tok = chat_tokenizer()
    parser = completion_parser(tok, SCHEMAS, "chat_template", max_depth=20)
    # 3,000 nested "[" in a call's arguments: transformers' recursive JSON reader raised RecursionError before
    # the depth check; 3,000 > max_depth=20, so the turn is its decoded text, as TRL falls back on a bad call
    text = '<tool_call>{"name": "add", "arguments": ' + "[" * 3000 + "]" * 3000 + "}</tool_call><|im_end|>"
    ids = tok(text)["input_ids"]
    assert parser(ids, []) == {"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)}
    # 21 levels: one past the cap, refused alike; 2 levels ({"a": [2]}) under it is parsed as before
    deep = '<tool_call>{"name": "add", "arguments": {"a": ' + "[" * 19 + "2" + "]" * 19 + "}}</tool_call><|im_end|>"
    assert "tool_calls" not in parser(tok(deep)["input_ids"], [])
    ok = '<tool_call>{"name": "add", "arguments": {"a": [2]}}</tool_call><|im_end|>'
    assert parser(tok(ok)["input_ids"], [])["tool_calls"][0]["function"]["name"] == "add"
