"""Asynchronous rollout: batches are sampled in the background by a policy snapshot at most
max_staleness updates old, the staleness is reported, and TIS corrects the stale samples."""

import json

import pytest

from grpokit.rollout.engine import HFEngine
from helpers.runs import make


@pytest.mark.parametrize("staleness", [1, 2])
def test_staleness_is_bounded_and_reported(tiny_model_dir, tmp_path, staleness):
    tr = make(
        tiny_model_dir,
        tmp_path / "run",
        **{"rollout.async_staleness": staleness, "train.steps": 4, "data.eval_size": 0},
    )
    tr.train()
    eng = tr.engine
    assert eng.log, "the background thread produced nothing"
    for index, version in eng.log:  # the invariant the producer enforces
        assert 0 <= index - version <= staleness, (index, version)
    assert not eng.thread.is_alive()  # closed at the end of train()
    steps = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"reward"' in l]
    assert len(steps) == 4
    for s in steps:
        assert 0 <= s["rollout/staleness"] <= staleness
        assert "tis/ratio_max" in s and "tis/logp_abs_diff_mean" in s
    assert steps[0]["rollout/staleness"] == 0  # the first batch comes from the initial policy


def test_synchronous_by_default(tiny_model_dir, tmp_path):
    tr = make(tiny_model_dir, tmp_path / "sync", **{"train.steps": 1})
    assert isinstance(tr.engine, HFEngine)  # sampling on the trainer's own model
    assert "rollout/staleness" not in tr.train_step()
