"""One running episode's record (``Row``) and the Rollout a batch of finished rows becomes.

rollout/episodes.py runs the turns and fills the rows: the tokens after the row's prompt with their
sampling log-probabilities, which of them the model wrote (mask 1) or the environment replied (0), the
turn of each token, a digest of the state each turn started from, the chat messages, and the tool counts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from grpokit.types import Episode, Rollout, grouped_prompts

from .episode_starts import Started


@dataclass
class Row:
    """One running episode."""

    ids: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    state_keys: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    tool_timeouts: int = 0
    tool_truncated: int = 0  # results cut at env.max_tool_output_chars
    tool_hung: bool = False  # a call ran past env.tool_timeout_s itself (not the episode's remaining budget)
    finish: str | None = None


def episodes_rollout(contexts: list[list[int]], rows: list[Row], started: Started, G: int) -> Rollout:
    """The finished rows as a Rollout, each with its Episode record (mask, turns, tools, environment, and
    from ``started``: whether its reset failed, its observation was cut, its prompt with that observation);
    ``contexts[i]``, the prompt row i started from, is its group's, or its own where its group's differ."""
    episodes = [
        Episode(
            model_mask=r.mask,
            turn_ids=r.turn_ids,
            state_keys=r.state_keys,
            messages=r.messages,
            tool_calls=r.tool_calls,
            tool_errors=r.tool_errors,
            environment=env,
            tool_timeouts=r.tool_timeouts,
            reset_failed=started.failed[k // G],
            tool_results_truncated=r.tool_truncated,
            observation_truncated=started.cut[k],
            observed=started.observed[k],
        )
        for k, (r, env) in enumerate(zip(rows, started.envs))
    ]
    prompt_ids, own = grouped_prompts(contexts, G)
    return Rollout(
        prompt_ids,
        [r.ids for r in rows],
        [r.logps for r in rows],
        [r.finish for r in rows],
        G,
        episodes,
        row_prompt_ids=own,
    )


def env_done(env: Any) -> bool:
    """The environment's ``done`` (False without one); one that cannot be read (a property that raises) ends
    the episode."""
    if env is None:
        return False
    try:
        return bool(getattr(env, "done", False))
    except Exception:
        return True


def state_key(prompt: list[int], ids: list[int]) -> str:
    """The state a turn starts from: a digest of the whole context (prompt + episode so far), so two
    episodes share a key exactly when the model saw the same tokens (GiGPO's identical states)."""
    h = hashlib.blake2b(digest_size=12)
    h.update(repr((prompt, ids)).encode())
    return h.hexdigest()
