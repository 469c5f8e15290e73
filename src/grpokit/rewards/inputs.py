"""What reward functions receive for a rollout: the prompts (one per completion) and the
completions (texts, chat messages or whole conversations) under grpokit's or TRL's convention.

Shared by the training loop and the evaluator, so both score a completion the same way; a leaf of
the rewards stage (it reads a Rollout's fields, imports only grpokit's records).
"""

from __future__ import annotations

from typing import Any


def reward_prompts(prompts, group_size: int, convention: str = "grpokit", episodes=None) -> list:
    """The ``prompts`` reward functions receive, one per completion: the text the model saw
    (grpokit), or the prompt as the dataset holds it, chat messages included (TRL). Where an environment's
    reset() observation joined an episode's prompt (``episodes[i].observed``), that prompt with it: TRL
    appends the observation to the last message of the prompt it passes, so with an environment that owns
    the data (no dataset prompt) the user turn is the observation."""
    rows = [p for p in prompts for _ in range(group_size)]
    seen = [getattr(e, "observed", None) for e in episodes] if episodes is not None else [None] * len(rows)
    if convention == "trl":
        return [o.raw if o is not None else p.raw if p.raw is not None else p.text for p, o in zip(rows, seen)]
    return [o.text if o is not None else p.text for p, o in zip(rows, seen)]


def row_prompts(prompts, convention: str = "grpokit") -> dict[str, list]:
    """TRL's ``inputs[i]["prompt"]`` under TRL's convention: the column ``prompt``, each completion's prompt as
    its dataset row holds it (``prompts``: one ``Prompt`` per completion), without a reset() observation, which
    only ``reward_prompts`` carries, as in TRL. A ``_calculate_rewards`` override reads it in ``inputs``; the
    runner passes it to no function (rewards/spec.py ``passed_columns``, TRL's rule), so only training's sampling
    builds it (the held-out evaluation and ``grpokit eval`` grade with plain runners). {} under grpokit's."""
    if convention != "trl":
        return {}
    return {"prompt": [p.raw if p.raw is not None else p.text for p in prompts]}


def reward_inputs(
    ro, texts: list[str], prompts=None, convention: str = "grpokit", parse=None
) -> tuple[list, dict[str, list]]:
    """What reward functions receive for a rollout: plain texts for single-turn completions (under
    the TRL convention, ``[{"role": "assistant", "content": text}]`` when the prompt is a list of
    chat messages, as TRL's GRPOTrainer passes them, or the message ``parse(ids, prompt_ids)`` makes
    of it: env/responses.py, a think block as reasoning_content); for episodes the whole conversation after the
    prompt (a list of messages) and, when there is an environment, ``environments`` (one instance
    per completion). ``prompts`` holds one ``Prompt`` per completion."""
    if ro.episodes is None or not any(e.messages for e in ro.episodes):  # plain, or a rollout_func's token masks
        if convention == "trl" and prompts is not None:
            return [
                (
                    [parse(ro.completion_ids[i], ro.prompt_of(i)) if parse else {"role": "assistant", "content": t}]
                    if isinstance(p.raw, list)
                    else t
                )
                for i, (p, t) in enumerate(zip(prompts, texts))
            ], {}
        return texts, {}
    extra = {}
    if any(e.environment is not None for e in ro.episodes):
        extra["environments"] = [e.environment for e in ro.episodes]
    return [e.messages for e in ro.episodes], extra


def model_answer(messages: list[Any]) -> str | None:
    """The model's answer in a conversation after the prompt (TRL's message form): the content of its last
    message when that message is the model's own (role "assistant", or no role) and calls no tool; None when
    the conversation ends otherwise: on a tool's or an environment's message (the episode ended by
    env.max_turns, ``done``, a terminal tool error or its tool time before the model answered), on a turn that
    called a tool, or with no message. A tool's result is never read as the model's answer."""
    if not messages or not isinstance(messages[-1], dict):
        return None
    last = messages[-1]
    if last.get("role", "assistant") != "assistant" or last.get("tool_calls"):
        return None
    return str(last.get("content", ""))


def unanswered(episodes) -> int:
    """How many of ``episodes`` (Episode records) end without the model's answer (``model_answer`` None);
    episodes without messages (a ``rollout_func``'s token masks) are the model's text, so answered."""
    return sum(bool(e.messages) and model_answer(e.messages) is None for e in episodes or [])
