"""The run's episode loop (multi-turn, tools, environments) from its config."""

from __future__ import annotations

from typing import Callable

from grpokit.config.sections import Config, ConfigError


def episode_runner(cfg: Config, tokenizer, tools: list[Callable] | None, environment_factory, task=None):
    """The episode loop for this run: the configured tools (``env.tools``, the task's, or passed
    callables) and environment (``env.environment`` or a passed ``environment_factory``: one factory, or a
    dict name -> factory routed per row by its ``environment`` column)."""
    from grpokit.data.prompts import render_prompt, with_observation
    from grpokit.env import resolve_environment, resolve_tools
    from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec

    e = cfg.env
    fns = resolve_tools(
        e.tools, tool_timeout_s=e.tool_timeout_s, allow_unsafe_code_execution=e.allow_unsafe_code_execution
    )
    fns += list(tools or [])
    if task is not None and not fns:
        fns = list(task.tools)
    factory = environment_factory or resolve_environment(e.environment)
    fmt = e.tool_format
    if fmt == "auto":
        fmt = (
            "chat_template"
            if getattr(tokenizer, "chat_template", None) and cfg.data.chat_template != "never"
            else "tags"
        )
    if fmt == "chat_template" and not getattr(tokenizer, "chat_template", None):
        raise ConfigError("env.tool_format=chat_template but the tokenizer has no chat template; use tags or auto")
    multi = bool(fns) or bool(factory)
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
    runner = EpisodeRunner(spec, tokenizer, tools=fns, environment_factory=factory)
    if fmt == "chat_template":  # a reset() observation joins the last user message, re-rendered with the row's tools
        runner.render_prompt = lambda raw, obs, schemas: list(
            tokenizer(
                render_prompt(with_observation(raw, obs), tokenizer, cfg.data, schemas), add_special_tokens=False
            )["input_ids"]
        )
    return runner
