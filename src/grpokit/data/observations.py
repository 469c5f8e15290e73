"""An environment's reset() observation joined to its row's prompt, in TRL's two forms.

TRL's ``_generate_and_score_completions`` appends what ``reset()`` returns to the content of the prompt's
last message: a string to a string content, a list of content parts to a list content (a string content
first becoming one text part), a string to a list content as one more text part. Anything else fails
there (a list item without ``"type"`` in ``_tokenize_prompts``, a number in the concatenation), so
grpokit refuses it in one sentence; an image part would need image prompts, which environments do not
support yet (data/prompts.py).
"""

from __future__ import annotations

from typing import Any

from grpokit.config.sections import ConfigError

Observation = str | tuple[str, ...]
"""A reset() observation as grpokit keeps it: a string, or the texts of the text parts of a list (a tuple:
one observation is a key when a group's observations are compared)."""

FORMS = "a string, None, or a list of text content parts such as [{'type': 'text', 'text': '...'}]"


def observation_of(value: Any) -> Observation | None:
    """What ``reset()`` returned as an ``Observation``: None and a string as they are, a list of text parts
    as the tuple of their texts; anything else refused in one sentence naming what was wrong.
    Example: [{"type": "text", "text": " board"}] -> (" board",); [{"role": "user", ...}] is refused."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ConfigError(
            f"an environment's reset() returned a {type(value).__name__} ({value!r:.60}); return {FORMS}, which TRL "
            "appends to the prompt's last message"
        )
    for n, part in enumerate(value):
        if not isinstance(part, dict) or "type" not in part:
            raise ConfigError(
                f"an environment's reset() returned a list whose item {n} ({part!r:.60}) is not a content part "
                f"(a dict with 'type'); return {FORMS}, which TRL appends to the prompt's last message's content"
            )
        if part["type"] != "text" or not isinstance(part.get("text"), str):
            raise ConfigError(
                f"an environment's reset() returned a {part['type']!r} content part (item {n}: {part!r:.60}); "
                "grpokit joins text parts ({'type': 'text', 'text': <a string>}) only: environments with image "
                "prompts are not supported yet"
            )
    return tuple(part["text"] for part in value)


def observation_text(observation: Observation) -> str:
    """The observation's text: the string, or its parts' texts one after another (what a prompt that is not
    rendered through the chat template gets appended)."""
    return observation if isinstance(observation, str) else "".join(observation)


def with_observation(prompt: Any, observation: Observation) -> Any:
    """The prompt with an environment's reset() observation appended (to the last message's content
    for chat messages, as TRL does: a content of typed parts gets a string observation as one more text
    part; text parts are appended as parts, a string content first becoming one text part; a string
    observation to the text otherwise). Parts with a text prompt are refused: TRL takes them only after a
    message. Example: [{"role": "user", "content": "play"}] with (" go",) ->
    [{"role": "user", "content": [{"type": "text", "text": "play"}, {"type": "text", "text": " go"}]}]."""
    chat = isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict)
    if isinstance(observation, tuple):
        if not chat:
            raise ConfigError(
                "an environment's reset() returned content parts for a prompt that is a text, not chat messages; "
                "return a string, or give the rows chat-message prompts (TRL appends parts to the last message)"
            )
        last = prompt[-1]
        content = last.get("content", "")
        head = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
        return prompt[:-1] + [{**last, "content": head + [{"type": "text", "text": t} for t in observation]}]
    if chat:
        last = prompt[-1]
        content = last.get("content", "")
        if isinstance(content, list):
            return prompt[:-1] + [{**last, "content": content + [{"type": "text", "text": observation}]}]
        return prompt[:-1] + [{**last, "content": str(content) + observation}]
    return str(prompt) + observation
