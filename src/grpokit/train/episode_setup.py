"""The run's episode loop (multi-turn, tools, environments) from its config."""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from grpokit.config.sections import Config, ConfigError, EnvConfig

log = logging.getLogger("grpokit.env")


def episode_runner(cfg: Config, tokenizer, tools: list[Callable] | None, environment_factory, task=None):
    """The episode loop for this run: the configured tools (``env.tools``, the task's, or passed
    callables) and environment (``env.environment`` or a passed ``environment_factory``: one factory, or a
    dict name -> factory routed per row by its ``environment`` column)."""
    from grpokit.data.observations import with_observation
    from grpokit.data.prompts import render_prompt
    from grpokit.env import resolve_environment, resolve_tools
    from grpokit.env.responses import completion_parser
    from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec

    e = cfg.env
    fns = resolve_tools(
        e.tools, tool_timeout_s=e.tool_timeout_s, allow_unsafe_code_execution=e.allow_unsafe_code_execution
    )
    fns += list(tools or [])
    if task is not None and not fns:
        fns = list(task.tools)
    factory = environment_factory or resolve_environment(e.environment)
    multi = bool(fns) or bool(factory)
    if not multi:
        warn_unread_episode_settings(e)
    fmt, template_kwargs = suffix_settings(cfg, tokenizer, tool_format(cfg, tokenizer, multi), multi)
    spec = EpisodeSpec(
        max_turns=e.max_turns if multi else 1,
        max_episode_tokens=e.max_episode_tokens,
        tool_timeout_s=e.tool_timeout_s,
        episode_timeout_s=e.episode_timeout_s,
        max_tool_output_chars=e.max_tool_output_chars,
        tool_format=fmt,
        max_tool_nesting=e.max_tool_nesting,
        reset_timeout_s=e.reset_timeout_s,
        max_observation_chars=e.max_observation_chars,
        max_failure_fraction=e.max_failure_fraction,
    )
    runner = EpisodeRunner(spec, tokenizer, tools=fns, environment_factory=factory, template_kwargs=template_kwargs)
    if cfg.reward.convention == "trl":  # completions and turns become the messages TRL parses them into
        runner.parse_message = completion_parser(tokenizer, runner.schemas, fmt, e.max_tool_nesting)
    if fmt == "chat_template":  # a reset() observation joins the last user message, re-rendered with the row's tools
        runner.render_prompt = lambda raw, obs, schemas: render_prompt(
            with_observation(raw, obs), tokenizer, cfg.data, schemas
        )
    return runner


EPISODE_ONLY = ("tools", "environment")
"""The env fields that make episodes multi-turn; every other env field is read only inside such episodes."""


def warn_unread_episode_settings(e: EnvConfig) -> None:
    """Warn once that env.* settings changed from their defaults act on nothing: this run's episodes are one plain
    completion (no env.tools or env.environment, no tools or environment_factory passed, no task's tools). A
    warning, not a refusal: tools passed in code decide it, so a config shared by runs with and without them
    stays valid."""
    default = EnvConfig()
    changed = [
        f"env.{f.name}={getattr(e, f.name)!r}"
        for f in dataclasses.fields(EnvConfig)
        if f.name not in EPISODE_ONLY and getattr(e, f.name) != getattr(default, f.name)
    ]
    if changed:
        log.warning(
            "grpokit: warning: %s change nothing in this run: its episodes are one plain completion (no env.tools, "
            "env.environment, tools or environment_factory, nor a task with tools); they act in multi-turn episodes "
            "only",
            ", ".join(changed),
        )


def tool_format(cfg: Config, tokenizer, multi: bool) -> str:
    """env.tool_format resolved: "auto" is chat_template when the tokenizer has a chat template that shows
    tools, else tags; a template that ignores ``tools`` (the prompt rendered with them is identical to the
    one without: SmolLM2-Instruct's) falls back to tags with one warning under auto and is refused with
    chat_template set (before: chosen, and the model never saw its tools). Only checked for episodes with
    tools or an environment (``multi``)."""
    from grpokit.env.parse import template_shows_tools

    fmt, has_template = cfg.env.tool_format, bool(getattr(tokenizer, "chat_template", None))
    if fmt == "chat_template" and not has_template:
        raise ConfigError("env.tool_format=chat_template but the tokenizer has no chat template; use tags or auto")
    auto = fmt == "auto"
    if auto:
        fmt = "chat_template" if has_template and cfg.data.chat_template != "never" else "tags"
    if fmt == "tags" or not multi or template_shows_tools(tokenizer, **cfg.data.chat_template_kwargs):
        return fmt
    if not auto:
        raise ConfigError(
            "env.tool_format=chat_template but this tokenizer's chat template does not show tools (a prompt rendered "
            "with tools is identical to one without), so the model would never see them; use env.tool_format=tags "
            "and describe the tools in the prompts, or a model whose template renders tools"
        )
    log.warning(
        "grpokit: warning: env.tool_format=auto: this tokenizer's chat template does not show tools (a prompt "
        "rendered with tools is identical to one without), so episodes use the tags format "
        "(<tool_call>NAME: ARGS</tool_call>), which does not list the tools in the prompt either: describe them "
        "and that format in your prompts"
    )
    return "tags"


def suffix_settings(cfg: Config, tokenizer, fmt: str, multi: bool) -> tuple[str, dict]:
    """The format and the template keywords of the tokens after a tool call, checked before the first step
    (env/templates.py): a chat template that cannot write them (it does not keep the conversation's prefix when
    a tool message follows, and grpokit knows no rewrite of it) used to fail at the first tool call, mid-step;
    now auto falls back to tags with one warning and chat_template set explicitly is refused. Qwen3's template
    gets grpokit's rewrite for the suffix (TRL swaps in its training template for the same reason)."""
    from grpokit.env.templates import suffix_keywords

    kwargs = dict(cfg.data.chat_template_kwargs)
    if fmt != "chat_template" or not multi:
        return fmt, kwargs
    keywords, why = suffix_keywords(tokenizer, kwargs)
    if keywords is not None:
        if "chat_template" in keywords:
            log.info(
                "grpokit: the chat template renders an assistant turn differently once a tool message follows it; "
                "the tokens after a tool call come from grpokit's prefix-keeping rewrite of it (the same tokens)"
            )
        return fmt, keywords
    if cfg.env.tool_format == "chat_template":
        raise ConfigError(
            f"env.tool_format=chat_template but this tokenizer's chat template cannot write the tokens after a tool "
            f"call: {why}, and grpokit knows no rewrite of it; use env.tool_format=tags and describe the tools and "
            "that format in the prompts, or a chat template that renders earlier turns alike whatever follows them"
        )
    log.warning(
        f"grpokit: warning: env.tool_format=auto: this tokenizer's chat template cannot write the tokens after a "
        f"tool call ({why}), so episodes use the tags format (<tool_call>NAME: ARGS</tool_call>), which does not "
        "list the tools in the prompt: describe them and that format in your prompts"
    )
    return "tags", kwargs
