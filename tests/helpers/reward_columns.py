"""What reward runners are handed: a spy on RewardRunner.score that records each call's ``columns``."""

from __future__ import annotations


def spy_reward_columns(monkeypatch) -> list[dict]:
    """Every ``columns`` a RewardRunner's score is given from now on (the test's monkeypatch undoes it), recorded
    before the call runs as it would."""
    from grpokit.rewards.runner import RewardRunner

    seen: list[dict] = []
    score = RewardRunner.score

    def spy(self, prompts, completions, completion_ids, group_size, columns=None, **kw):
        seen.append(dict(columns or {}))
        return score(self, prompts, completions, completion_ids, group_size, columns, **kw)

    monkeypatch.setattr(RewardRunner, "score", spy)
    return seen
