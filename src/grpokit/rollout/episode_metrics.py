"""The per-step metrics of a batch of episodes (rollout/episodes.py): turns, tool use and failures,
model and environment tokens, and why episodes ended. Plain completions have none.
"""

from __future__ import annotations

from grpokit.rewards.inputs import unanswered
from grpokit.types import Rollout


def episode_metrics(ro: Rollout) -> dict[str, float]:
    """Per-step metrics of a batch of episodes (empty for plain completions). Names of the same
    concept follow TRL: ``tools/call_frequency`` (calls per episode), ``tools/failure_frequency``."""
    if ro.episodes is None:
        return {}
    eps, n = ro.episodes, max(1, len(ro.episodes))
    calls = sum(e.tool_calls for e in eps)
    model_tokens = sum(sum(e.model_mask) for e in eps)
    out = {
        "episodes/turns_mean": sum(e.turns for e in eps) / n,
        "episodes/turns_max": float(max(e.turns for e in eps)),
        "episodes/tool_use_rate": sum(e.tool_calls > 0 for e in eps) / n,
        "episodes/tool_calls_mean": calls / n,
        "episodes/tool_errors_mean": sum(e.tool_errors for e in eps) / n,
        "episodes/model_tokens_mean": model_tokens / n,
        "episodes/env_tokens_mean": sum(e.env_tokens for e in eps) / n,
        "episodes/truncated_by_turns": ro.finish_reasons.count("turns") / n,
        "tools/call_frequency": calls / n,
        "tools/failure_frequency": sum(e.tool_errors for e in eps) / calls if calls else 0.0,
        # results cut at env.max_tool_output_chars, per call; observations cut at env.max_observation_chars
        "tools/truncated_frequency": sum(e.tool_results_truncated for e in eps) / calls if calls else 0.0,
        "episodes/observations_truncated": sum(e.observation_truncated for e in eps) / n,
        "episodes/tool_timeouts_mean": sum(e.tool_timeouts for e in eps) / n,
        "episodes/reset_failures": float(sum(e.reset_failed for e in eps)),
        # ended on a tool's message or a tool-calling turn: no answer to grade (rewards/inputs.py model_answer)
        "episodes/no_answer_fraction": unanswered(eps) / n,
    }
    for reason in ("done", "tool_error", "timeout"):
        out[f"episodes/finished_{reason}"] = ro.finish_reasons.count(reason) / n
    return out
