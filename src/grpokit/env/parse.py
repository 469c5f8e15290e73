"""Tool calls in the model's text, and tool results back into tokens.

Two formats, chosen by ``env.tool_format``:

* ``"chat_template"``: the tokenizer's own. The prompt is rendered with the tools' JSON schemas
  (``apply_chat_template(tools=...)``); the model answers a turn ending with its end-of-turn token;
  calls are the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks of that turn
  (the Hermes / Qwen convention many tool-calling templates share; other call syntaxes, e.g.
  Llama 3's, are not parsed yet: use ``rollout_func`` or the tag format for them); results are rendered by the template
  as ``{"role": "tool", "name": ..., "content": ...}`` messages followed by the next assistant
  header, exactly the tokens the template would produce (computed as TRL does: the template of a
  short conversation with and without the tool messages, the difference being the suffix).
* ``"tags"``, for models without a tool-calling template (the demo models): a call is
  ``<tool_call>BODY</tool_call>`` and ends the model's turn; BODY is a JSON object
  ``{"name": ..., "arguments": {...}}``, or ``NAME: ARGS``, or, when exactly one tool is offered,
  just ``ARGS``; a plain ARGS string is passed to the tool's first parameter. The result comes back
  as ``<tool_result>CONTENT</tool_result>`` and the model continues.

The text is the model's, so it is untrusted: a body nested deeper than ``max_depth`` brackets
(``env.max_tool_nesting``) is refused before ``json.loads`` sees it (1,000 levels were a RecursionError
that ended the step), and whatever the text, parsing ends in calls, never in an exception; a call
that could not be read has ``name == ""`` and says why in ``error``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_result>", "</tool_result>"
MAX_DEPTH = 20  # default env.max_tool_nesting: real tool arguments are a few levels deep
_CALL_RE = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name ("" when the body could not be read, with the reason in
    ``error``) and its arguments."""

    name: str
    arguments: dict[str, Any] | str
    error: str = ""


def nesting_depth(text: str) -> int:
    """How deeply ``{`` / ``[`` nest in JSON-like ``text`` (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "}]":
            depth = max(0, depth - 1)
    return deepest


def parse_tool_calls(text: str, tool_names: list[str], max_depth: int = MAX_DEPTH) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block of ``text``, in order (see the module docstring)."""
    return [_parse_body(body.strip(), tool_names, max_depth) for body in _CALL_RE.findall(text)]


def _parse_body(body: str, tool_names: list[str], max_depth: int = MAX_DEPTH) -> ToolCall:
    if body.startswith("{"):
        depth = nesting_depth(body)
        if max_depth and depth > max_depth:
            return ToolCall(
                "", body, error=f"the tool call nests {depth} levels deep, more than env.max_tool_nesting={max_depth}"
            )
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return ToolCall("", body, error="the tool call is not valid JSON")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return ToolCall("", body, error='the tool call is not an object with a string "name"')
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some templates put the arguments as a JSON string
            if not max_depth or nesting_depth(args) <= max_depth:
                try:
                    args = json.loads(args)
                except (ValueError, RecursionError):
                    pass
        return ToolCall(obj["name"], args if isinstance(args, (dict, str)) else str(args))
    name, sep, rest = body.partition(":")
    if sep and name.strip() in tool_names:
        return ToolCall(name.strip(), rest.strip())
    if len(tool_names) == 1:
        return ToolCall(tool_names[0], body)
    return ToolCall("", body, error="the tool call names no known tool")


def strip_calls(text: str) -> str:
    """The turn's text without its tool-call blocks (the assistant message's content)."""
    return _CALL_RE.sub("", text).strip()


def assistant_message(text: str, calls: list[ToolCall]) -> dict[str, Any]:
    """The turn as a chat message in TRL's form (``tool_calls`` only when there are calls)."""
    msg: dict[str, Any] = {"role": "assistant", "content": strip_calls(text) if calls else text}
    if calls:
        msg["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return msg


def tag_result_text(contents: list[str]) -> str:
    """The environment's reply in the tag format: one ``<tool_result>`` block per call."""
    return "".join(f"{RESULT_OPEN}{c}{RESULT_CLOSE}" for c in contents)


def template_suffix_ids(
    tokenizer, tool_messages: list[dict[str, Any]], tools: list | None = None, **template_kwargs
) -> list[int]:
    """Tokens the chat template puts after an assistant turn with tool calls: the tool messages
    and the next assistant header. Computed on a short stand-in conversation, with and without the
    tool messages (as TRL's _get_tool_suffix_ids); the template must keep the prefix, which the run checks
    before its first step (env/templates.py, where a known template that does not gets grpokit's rewrite,
    passed here as ``chat_template``). ``template_kwargs`` are the run's ``data.chat_template_kwargs``
    (TRL's chat_template_kwargs), as the prompt was rendered with: the next assistant header is the
    template's generation prompt, which they shape (Qwen3's enable_thinking=False writes an empty think
    block into it)."""
    kw = {**template_kwargs, **({"tools": tools} if tools else {})}
    try:
        prefix, full = _stand_in(tokenizer, tool_messages, {}, kw)
    except TypeError:  # a template that writes the arguments as text (DeepSeek-V3's): TRL's fallback too
        prefix, full = _stand_in(tokenizer, tool_messages, "{}", kw)
    eos = tokenizer.eos_token_id
    if eos in prefix:  # the sampled turn ends at the end-of-turn token; what the template adds after it is suffix
        prefix = prefix[: len(prefix) - prefix[::-1].index(eos)]
    if full[: len(prefix)] != prefix:
        raise ValueError(
            "the chat template does not keep the conversation's prefix when tool messages are added; "
            "use env.tool_format=tags"
        )
    return full[len(prefix) :]


def _stand_in(tokenizer, tool_messages: list[dict[str, Any]], arguments: Any, kw: dict) -> tuple[list, list]:
    """The stand-in conversation's tokens without and with the tool messages (the latter with the generation
    prompt); its assistant turn calls each message's tool with ``arguments``."""
    calls = [{"type": "function", "function": {"name": m["name"], "arguments": arguments}} for m in tool_messages]
    head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    prefix = list(tokenizer.apply_chat_template(head, tokenize=True, return_dict=False, **kw))
    full = tokenizer.apply_chat_template(
        head + tool_messages, tokenize=True, add_generation_prompt=True, return_dict=False, **kw
    )
    return prefix, list(full)


PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "A stand-in tool.",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "string", "description": "x"}},
            "required": ["x"],
        },
    },
}
"""A stand-in tool's schema, for the checks of a chat template made before a run starts."""


def template_shows_tools(tokenizer, **template_kwargs) -> bool:
    """Whether the tokenizer's chat template shows the tools it is given: a one-message prompt rendered with a
    stand-in tool's schema differs from the same prompt without it. Templates that ignore ``tools``
    (SmolLM2-Instruct's, for one) render both alike, and a model prompted through them never sees its tools;
    a template that raises with ``tools`` shows none either."""
    messages = [{"role": "user", "content": "x"}]
    kw = {"tokenize": False, "add_generation_prompt": True, **template_kwargs}
    try:
        bare = tokenizer.apply_chat_template(messages, **kw)
        shown = tokenizer.apply_chat_template(messages, tools=[PROBE_TOOL], **kw)
    except Exception:
        return False
    return shown != bare
