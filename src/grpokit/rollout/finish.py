"""Why a completion ended, when its sampler did not say: read from its last token.

grpokit's engines record each completion's finish reason as they sample ("eos", "stop", "length").
Completions made elsewhere (TRL's ``rollout_func`` without a ``finish_reasons`` key, a GRPOTrainer
subclass's own ``_generate_single_turn``) come without one; then the rule is TRL's: a completion
ended by itself when its last token is an end-of-sequence id or the pad id, and was cut ("length")
otherwise, whatever its length. A length test would call a completion that ends on EOS exactly at the
cap truncated. An empty completion has no last token and counts as cut, as nothing ended it.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from grpokit.algo.masks import ended_rows

# what Rollout.finish_reasons may hold (types.py): the engines' reasons, then the episode loop's
FINISH_REASONS = ("eos", "stop", "length", "turns", "done", "tool_error", "timeout")


def end_ids(eos_token_ids: Iterable[int], pad_token_id: int | None) -> frozenset[int]:
    """The ids that end a completion by the last-token rule: every EOS id and the pad id (TRL's set)."""
    return frozenset(eos_token_ids) | ({pad_token_id} if pad_token_id is not None else set())


def finish_by_last_token(completion_ids: Sequence[Sequence[int]], ends: frozenset[int]) -> list[str]:
    """One reason per completion: "eos" when its last token is in ``ends`` (see ``end_ids``), else "length"."""
    ended = ended_rows(list(completion_ids), ends) or [False] * len(completion_ids)  # no end ids: nothing ended
    return ["eos" if e else "length" for e in ended]
