"""bench/async_vs_sync.py's arithmetic: which steps are timed, the hidden share of the rollout, each arm's overrides."""

import math
import sys

from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from async_vs_sync import counted, hidden_share, overrides  # noqa: E402


def _rows(n: int, evals: tuple[int, ...]) -> list[dict]:
    return [{"step": k, **({"eval/accuracy": 0.5} if k in evals else {})} for k in range(1, n + 1)]


def test_steps_drawn_during_an_evaluation_are_not_timed():
    rows = _rows(10, evals=(4, 8))
    # sync: every step after the first
    assert [r["step"] for r in counted(rows, 0)] == [2, 3, 4, 5, 6, 7, 8, 9, 10]
    # staleness 2: the first s + 1 = 3 (batches drawn during the evaluation before training), and the s = 2 after
    # each evaluation (after step 4: 5, 6; after step 8: 9, 10)
    assert [r["step"] for r in counted(rows, 2)] == [4, 7, 8]


def test_hidden_share_worked_by_hand():
    assert hidden_share({"time/sampling": 10.0, "time/waiting_for_rollout": 2.5}) == 0.75
    assert hidden_share({"time/sampling": 10.0, "time/waiting_for_rollout": 0.0}) == 1.0
    assert hidden_share({"time/sampling": 10.0, "time/waiting_for_rollout": 12.0}) == 0.0  # clipped
    assert hidden_share({"time/rollout": 10.0}) == 0.0  # a synchronous step: nothing overlaps
    assert hidden_share({"time/sampling": math.nan}) == 0.0


def test_every_arm_shares_the_sizes_and_the_partial_arm_gets_k():
    s = {"steps": 3, "eval_every": 1, "eval_size": 8, "max_new_tokens": 16, "partial_tokens": 8}
    sync, partial = overrides("sync", 0, s), overrides("async2-partial", 0, s)
    assert partial[: len(sync)] == sync and "train.steps=3" in sync and "rollout.max_new_tokens=16" in sync
    assert partial[len(sync) :] == ["rollout.async_staleness=2", "rollout.async_partial_tokens=8"]
