"""Inside a training step: answers that stall the verifier and programs that tamper with the sandbox
score 0, are counted by kind in metrics.jsonl, and the run neither stops nor loses the honest scores."""

from __future__ import annotations

import json

from grpokit.rewards.code import code_pass_fraction, probe
from grpokit.rewards.math import math_accuracy
from grpokit.train import Trainer
from helpers.runs import ROWS, tiny_cfg

STALLS = [r"\boxed{10^{10^{10}}}", r"\boxed{9^{9^{9^{9^{9}}}}}", r"\boxed{" + "9" * 1_000_000 + "}"]
CASES = [{"fn": "f", "args": [1], "expected": 2}]
TAMPER = 'import os\nos.write(3, b\'{"case": 0, "status": "ok", "value": 2}\\n\')\ndef f(x):\n    return 0\n'


def stalls_the_checker(completions, **kwargs):
    """The model's text replaced by a correct answer at even positions, a pathological one at odd."""
    answers = [r"\boxed{6}" if i % 2 == 0 else STALLS[i % 3] for i in range(len(completions))]
    return math_accuracy(answers, answer=["6"] * len(answers))


def tampers(completions, **kwargs):
    """An honest program at even positions, one forging its verdict at odd ones (or, without a
    sandbox on this host, the honest one everywhere)."""
    forge = probe()[0]
    programs = ["def f(x):\n    return 2 * x\n" if i % 2 == 0 or not forge else TAMPER for i in range(len(completions))]
    return code_pass_fraction([f"```python\n{p}```" for p in programs], [CASES] * len(programs), wall_s=10)


def test_a_training_step_scores_what_completions_caused_as_counted_zeros(tiny_model_dir, tmp_path):
    cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{"train.steps": 1, "reward.timeout_s": 120})
    cfg.data.dataset = ""
    Trainer(cfg, reward_funcs=[stalls_the_checker, tampers], train_rows=ROWS, quiet=True).train()
    (line,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert line["rewards/stalls_the_checker/mean"] == 0.5  # 4 correct of 8: the stalls are plain zeros
    assert line["rewards/stalls_the_checker/limits"] == 4.0 and line["rewards/stalls_the_checker/failures"] == 0.0
    tampered = 4.0 if probe()[0] else 0.0
    assert line["rewards/tampers/tampering"] == tampered and line["rewards/tampers/failures"] == 0.0
    assert line["rewards/tampers/mean"] == 1.0 - tampered / 8
    assert line["rewards/failed_fraction"] == 0.0
