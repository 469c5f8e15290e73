"""A completion as the chat message TRL makes of it: parsed by a response template (reward.convention=trl).

TRL 1.16 hands reward functions each completion of chat-message prompts parsed by transformers'
``tokenizer.parse_response`` whenever the tokenizer has a ``response_template``, and it gives one to a tokenizer
without one when tools are passed: a reasoning model's ``<think>`` block then becomes ``reasoning_content`` beside
``content``, and its calls ``tool_calls`` (each turn of a tool episode alike, parsed after everything before it).
Under the TRL convention grpokit does the same through the same public API:

- a tokenizer's own ``response_template`` is used as it is (no tools needed, as in TRL);
- with tools in the chat-template format and no template of its own, the run's tokenizer gets grpokit's, built here
  from the call syntax grpokit's parser reads (``<tool_call>`` JSON, after an optional ``<think>`` block, in a
  ChatML turn: Qwen2.5's and Qwen3's templates, the ones TRL gives that syntax). A template in another format keeps
  the decoded text as the content, as before.

What cannot be parsed (a malformed call, a cut turn whose parse fails) is the decoded text, as in TRL; so is a turn
whose brackets nest deeper than ``env.max_tool_nesting`` (checked before the parser's recursive JSON reader sees it,
as env/parse.py checks grpokit's own calls), so one hostile completion cannot crash the step. grpokit's
own convention is unchanged: a completion is its whole text, think block included.
"""

from __future__ import annotations

import re
from typing import Any

from .parse import CALL_CLOSE, CALL_OPEN, MAX_DEPTH, nesting_depth

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CHATML_TURN, CHATML_END = "<|im_start|>", "<|im_end|>"


def chatml_tool_template(tokenizer) -> dict[str, Any] | None:
    """grpokit's response template for tool calls in a ChatML turn (see the module docstring), or None when the
    tokenizer's chat template writes another format. Each field closes at its tag and the whitespace after it."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or CALL_OPEN not in template or CHATML_TURN not in template:
        return None

    def closing(tag: str) -> str:
        return re.escape(tag) + r"\s*"

    return {
        "defaults": {"role": "assistant"},
        "start_anchor": f"{CHATML_TURN}assistant\n",  # the prompt's last header: a pre-written think block follows
        "fields": {
            "reasoning_content": {"open": THINK_OPEN, "close_pattern": closing(THINK_CLOSE), "content": "text"},
            "tool_calls": {
                "open": CALL_OPEN,
                "close_pattern": closing(CALL_CLOSE),
                "repeats": True,
                "content": "json",
                "transform": {"type": "function", "function": "{content}"},
            },
            "content": {"close_pattern": closing(CHATML_END), "content": "text"},
        },
    }


class ResponseParser:
    """``(ids, prefix_ids) -> message``: one completion (or an episode's turn) after the tokens before it, parsed
    by ``template`` with the ``tools``' schemas typing the call arguments, normalised as TRL normalises it. A turn
    nesting ``{``/``[`` deeper than ``max_depth`` (0 = no cap) is its text, unparsed."""

    def __init__(
        self, tokenizer, template: dict[str, Any], tools: list[dict] | None = None, max_depth: int = MAX_DEPTH
    ):
        self.tokenizer, self.template, self.tools, self.max_depth = tokenizer, template, tools or None, max_depth

    def __call__(self, ids: list[int], prefix: list[int]) -> dict[str, Any]:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if self.max_depth and nesting_depth(text) > self.max_depth:
            return {"role": "assistant", "content": text}  # too deep for the recursive JSON reader: its text
        try:
            message = self.tokenizer.parse_response(list(ids), self.template, prefix=list(prefix), tools=self.tools)
            if not isinstance(message, dict):  # nothing left of a heavily cut response
                raise ValueError("no message")
            _check_calls(message.get("tool_calls"))
        except (ValueError, TypeError, RecursionError):  # a malformed call: the turn is its text, as TRL falls back
            return {"role": "assistant", "content": text}
        eos = self.tokenizer.eos_token
        if isinstance(message.get("content"), str) and eos:
            message["content"] = message["content"].removesuffix(eos)
        message["content"] = message.get("content") or ""  # always a string, "" for a turn that only calls
        return message


def _check_calls(calls: Any) -> None:
    """A call without a string name is malformed (ValueError); a call without arguments gets {} (TRL's rules)."""
    for call in calls or []:
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError("a tool call without a name")
        if fn.get("arguments") is None:
            fn["arguments"] = {}


def completion_parser(
    tokenizer, schemas: list[dict] | None, tool_format: str, max_depth: int = MAX_DEPTH
) -> ResponseParser | None:
    """The run's parser under the TRL convention: the tokenizer's ``response_template``, else grpokit's for tools
    in the chat-template format; None when neither applies (completions stay their text). ``max_depth`` is
    ``env.max_tool_nesting``."""
    template = getattr(tokenizer, "response_template", None)
    if template is None and schemas and tool_format == "chat_template":
        template = chatml_tool_template(tokenizer)
    return None if template is None else ResponseParser(tokenizer, template, schemas, max_depth)
