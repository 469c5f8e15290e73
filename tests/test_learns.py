"""The embedded default learns: a short run of the built-in task on the shipped demo model."""

import json

from grpokit.config import Config, apply_overrides
from grpokit.train import Trainer


def test_builtin_task_reward_and_accuracy_rise(tmp_path):
    cfg = apply_overrides(Config(), ["train.steps=20", "data.eval_size=200", "record.sinks=[]",
                                     f"train.out={tmp_path / 'run'}"])
    summary = Trainer(cfg, quiet=True).train()
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first, last = lines[0]["reward"], sum(l["reward"] for l in lines[-3:]) / 3
    assert summary["eval_before"]["accuracy"] <= 0.5  # the demo model starts honestly imperfect
    assert last > first + 0.2, (first, last)
    assert summary["eval_after"]["accuracy"] >= 0.8, summary
    assert (tmp_path / "run" / "report.html").exists()
