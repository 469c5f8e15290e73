"""A run survives reward functions that raise or hang; non-finite steps are skipped, then stop the run."""

import json
import time

import pytest
import torch

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.record.health import TrainingHealthError
from grpokit.train import Trainer


def flaky_reward(prompts, completions, answer, **kwargs):
    """Raises for groups whose prompt starts with 1, hangs for groups whose prompt starts with 2."""
    if prompts[0].startswith("1"):
        raise RuntimeError("boom")
    if prompts[0].startswith("2"):
        time.sleep(60)
    return [float(f"<answer>{a}</answer>" in c) for c, a in zip(completions, answer)]


def demo_cfg(tmp_path, *extra):
    return apply_overrides(
        Config(),
        [
            "train.steps=2",
            "train.prompts_per_step=8",
            "data.eval_size=8",
            "record.sinks=[]",
            "record.report=false",
            f"train.out={tmp_path / 'run'}",
            *extra,
        ],
    )


@pytest.mark.parametrize("workers", [0, 1])
def test_raising_and_hanging_rewards_do_not_stop_the_run(tmp_path, workers):
    cfg = demo_cfg(
        tmp_path,
        "reward.functions=[]",
        "reward.timeout_s=1.0",
        f"reward.num_workers={workers}",
        "reward.max_failure_fraction=1.0",
    )
    t0 = time.perf_counter()
    summary = Trainer(cfg, reward_funcs=[flaky_reward], quiet=True).train()
    assert summary["steps"] == 2
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(l["rewards/flaky_reward/failures"] for l in lines) > 0
    assert time.perf_counter() - t0 < 50  # a hang costs its timeout, not 60 s per call


def test_too_many_failures_stop_with_a_clear_message(tmp_path):
    def always_fails(prompts, completions, **kw):
        raise ValueError("nope")

    cfg = demo_cfg(tmp_path, "reward.functions=[]", "reward.max_failure_fraction=0.5")
    with pytest.raises(Exception, match="always_fails"):
        Trainer(cfg, reward_funcs=[always_fails], quiet=True).train()


def test_non_finite_steps_are_skipped_then_stop_the_run(tmp_path, monkeypatch):
    import grpokit.train.update as update

    real = update.objective_loss

    def nan_loss(*args, **kwargs):
        loss, m = real(*args, **kwargs)
        return loss * float("nan"), m

    monkeypatch.setattr(update, "objective_loss", nan_loss)
    cfg = demo_cfg(tmp_path, "train.steps=6", "health.max_nonfinite_steps=3")
    tr = Trainer(cfg, quiet=True)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    with pytest.raises(TrainingHealthError, match="3"):
        tr.train()
    for n, p in tr.model.named_parameters():  # no NaN update was ever applied
        assert torch.equal(before[n], p.detach()), n
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [l["skipped_nonfinite"] for l in lines] == [1.0, 1.0, 1.0]
