"""The chat template's tool-result tokens, checked before a run's first step.

With ``env.tool_format=chat_template`` the tokens after a tool call are the template's own: the stand-in
conversation rendered with and without a tool message, the difference being the suffix (env/parse.py
``template_suffix_ids``, TRL's _get_tool_suffix_ids). That holds only for a template that renders the earlier
turns alike whatever follows them ("keeps the prefix"), and a template that does not used to fail at the first
tool call, in the middle of a step. ``suffix_keywords`` checks it when the run is built, with the run's
``data.chat_template_kwargs``.

A known template that does not keep the prefix gets grpokit's rewrite, used for the suffix only (TRL swaps in
a training template at init for the same reason, get_training_chat_template). Qwen3's template (Qwen3-0.6B ...
Qwen3-235B-A22B) writes the ``<think>`` block of an assistant turn after the last user query only into the last
message (or one with reasoning), so the tool-calling turn loses its empty block once a tool message follows it.
The rewrite writes the block into every such turn. Only the assistant turn's rendering changes, so the tokens
after its end-of-turn token, the suffix, are those of the original template; the prompts (which end with a
user or tool message) are rendered by the original too, so the model sees its own template's text everywhere.
"""

from __future__ import annotations

import re
from typing import Any

from .parse import PROBE_TOOL, template_suffix_ids

# Qwen3: "the last message, or one with reasoning" -> every assistant turn after the last user query
_QWEN3_LAST_TURN_THINK = re.compile(r"loop\.last\s+or\s+\(\s*not\s+loop\.last\s+and\s+reasoning_content\s*\)")
_PROBE_MESSAGE = [{"role": "tool", "name": PROBE_TOOL["function"]["name"], "content": "x"}]


def prefix_fault(tokenizer, template_kwargs: dict[str, Any]) -> str:
    """Why the template's tool-result tokens cannot be computed ("" when they can): the stand-in conversation of
    ``template_suffix_ids`` with a tool message, rendered with ``template_kwargs`` and a stand-in tool."""
    try:
        template_suffix_ids(tokenizer, _PROBE_MESSAGE, [PROBE_TOOL], **template_kwargs)
    except ValueError as e:
        if "keep the conversation's prefix" in str(e):
            return "it does not keep the conversation's prefix when a tool message is added"
        return f"it fails on a tool message ({type(e).__name__}: {str(e)[:200]})"
    except Exception as e:  # a template error: jinja's, or one the template raises itself
        return f"it fails on a tool message ({type(e).__name__}: {str(e)[:200]})"
    return ""


def prefix_keeping_template(template: str) -> str | None:
    """grpokit's rewrite of a known template that does not keep the prefix (see the module docstring), or None
    when ``template`` is none it knows."""
    rewritten, n = _QWEN3_LAST_TURN_THINK.subn("true", template)
    return rewritten if n else None


def suffix_keywords(tokenizer, template_kwargs: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The keywords of ``template_suffix_ids`` for this run, and what was wrong: ``(template_kwargs, "")`` when
    the tokenizer's template keeps the prefix, ``(template_kwargs + chat_template=<rewrite>, "")`` when grpokit's
    rewrite of it does, else ``(None, why)``."""
    why = prefix_fault(tokenizer, template_kwargs)
    if not why:
        return dict(template_kwargs), ""
    template = tokenizer.get_chat_template(tools=[PROBE_TOOL])  # the one apply_chat_template uses with tools
    rewrite = prefix_keeping_template(template)
    if rewrite is not None:
        keywords = {**template_kwargs, "chat_template": rewrite}
        if not prefix_fault(tokenizer, keywords):
            return keywords, ""
    return None, why
