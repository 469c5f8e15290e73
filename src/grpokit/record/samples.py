"""Build the rows of samples.jsonl from one batch: a few prompts, each with all of its G completions.

Reading completions is the fastest way to see what a policy learned (or which shortcut it found in
the reward), so every `samples_every` steps the trainer passes a few prompts to
`Recorder.log_samples`. One row per prompt:

    {"prompt": "What is 2+3?",
     "completions": [{"text": "...", "rewards": {"math": 1.0, "format": 0.5}, "reward": 1.5,
                      "advantage": 0.87, "length": 42, "finish_reason": "stop",
                      "messages": [...]}, ...]}          # "messages": episodes only (the conversation)
                                                         # "prompt": a completion's own, where it differs

The recorder adds "step". Texts are stored verbatim: they are untrusted model output, and every
reader (the HTML report included) must escape them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def sample_rows(
    prompts: Sequence[str],
    texts: Sequence[str],
    rewards_per_func: Mapping[str, Sequence[float]],
    rewards: Sequence[float],
    advantages: Sequence[float],
    lengths: Sequence[int],
    finish_reasons: Sequence[str],
    group_size: int,
    max_prompts: int = 4,
    messages: Sequence[Sequence[Mapping[str, Any]]] | None = None,
    completion_prompts: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Rows for `Recorder.log_samples` from flat per-completion lists.

    `prompts` has P entries; every other sequence has N = P * G entries grouped contiguously
    (completions g*G .. g*G+G-1 answer prompt g), as are `rewards_per_func[name]`. Only the first
    `max_prompts` prompts are kept. `messages` (N conversations, for multi-turn episodes) adds each
    completion's whole conversation turn by turn: assistant turns (with their `tool_calls`) and the
    `tool` messages that answered them. `completion_prompts` (N, each completion's own prompt) gives a
    completion whose prompt differs from its row's (an environment's reset() that returned another
    observation for it) a `prompt` of its own.
    """
    n = len(texts)
    if n != len(prompts) * group_size:
        raise ValueError(f"sample_rows: {len(prompts)} prompts x group_size {group_size} != {n} completions")
    for name, seq in [
        ("rewards", rewards),
        ("advantages", advantages),
        ("lengths", lengths),
        ("finish_reasons", finish_reasons),
        *((f"rewards_per_func[{k!r}]", v) for k, v in rewards_per_func.items()),
    ]:
        if len(seq) != n:
            raise ValueError(f"sample_rows: {name} has {len(seq)} entries, expected {n}")
    rows: list[dict[str, Any]] = []
    for p, prompt in enumerate(prompts[:max_prompts]):
        completions = []
        for i in range(p * group_size, (p + 1) * group_size):
            completions.append(
                {
                    "text": texts[i],
                    "rewards": {name: float(vals[i]) for name, vals in rewards_per_func.items()},
                    "reward": float(rewards[i]),
                    "advantage": float(advantages[i]),
                    "length": int(lengths[i]),
                    "finish_reason": str(finish_reasons[i]),
                }
            )
            if messages is not None:
                completions[-1]["messages"] = [dict(m) for m in messages[i]]
            if completion_prompts is not None and completion_prompts[i] != prompt:
                completions[-1]["prompt"] = completion_prompts[i]
        rows.append({"prompt": prompt, "completions": completions})
    return rows
