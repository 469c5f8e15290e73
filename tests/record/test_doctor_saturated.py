"""A reward pinned at one value from the first steps, a few outliers aside (a verifier that accepts every
answer, prompts the model already solves), is named as such, by the doctor and the live monitor alike; a
run that started lower and rose to solve every group converged, and stays "converged" (hunter's issue A).

The planted runs are metrics.jsonl lines as the trainer writes them (helpers.doctor_runs.trainer_row),
P = 16 groups of G = 8, 30 steps, beta > 0 (grad_norm never exactly 0, so zero_grad_steps cannot name it)."""

from __future__ import annotations

import json
from pathlib import Path

from grpokit.cli import main
from grpokit.config.health import HealthConfig
from grpokit.record.doctor import diagnose, examine, format_findings
from grpokit.record.health import HealthMonitor
from grpokit.record.report_data import load_run
from helpers.doctor_runs import trainer_row, write_run

P, G, STEPS = 16, 8, 30


def all_one(zeros: int = 0) -> list[list[float | None]]:
    """Every completion 1.0 except the first completion of the first `zeros` groups (0.0)."""
    return [[0.0 if g < zeros and j == 0 else 1.0 for j in range(G)] for g in range(P)]


def live_events(rows: list[dict]) -> list[tuple[int, str, str]]:
    hm = HealthMonitor(HealthConfig())
    return [(e.step, e.level, e.monitor) for r in rows for e in hm.observe(r, r["step"])[0]]


def test_a_reward_at_1_but_for_its_very_first_completion_is_named(tmp_path: Path) -> None:
    # step 1: one 0 among 128 completions (group 0 not solved: 15/16 = 94% of groups solved, >= 90%); steps
    # 2-30: every completion 1. Pinned at 1 in 30 of 30 steps. Mean reward of steps 1-10 (the doctor's window,
    # 30 // 3): (127/128 + 9) / 10 = 0.99922, 0.0008 of the range 0-1 away from 1 (<= 1 - 0.85): from the start.
    rows = [trainer_row(s, all_one(zeros=1 if s == 1 else 0)) for s in range(1, STEPS + 1)]
    path = write_run(tmp_path / "run", rows)
    found = diagnose(load_run(path))
    assert [f.code for f in found] == ["reward_constant"]  # zero_std_groups restates it: left out
    f = found[0]
    assert f.title.startswith("The reward is pinned at 1 from the first steps") and f.level == "error"
    assert f.evidence.startswith("in 30 of 30 steps (100%) at least 90% of groups had every completion at 1")
    assert "mean reward 0.999 in steps 1-10" in f.evidence and "a verifier that accepts every answer" in f.advice
    assert "nothing to fix" not in format_findings(examine(load_run(path)), "run")
    assert main(["doctor", str(path), "--fail-on", "warning"]) == 1
    # the live monitor: zero-std groups are waste, not "Converged" (before: an info event at step 10, no warning)
    assert live_events(rows) == [(10, "warning", "zero_std_groups")]


def test_a_few_outliers_do_not_hide_it(tmp_path: Path) -> None:
    # step 1: two groups with a 0 (14/16 = 87.5% solved, < 90%: not pinned); steps 7 and 19: one group each
    # (15/16, pinned). 29 of 30 steps pinned (97% >= 90%); mean reward of steps 1-10: (126/128 + 127/128 + 8) / 10
    # = 0.99766, still at the top.
    zeros = {1: 2, 7: 1, 19: 1}
    rows = [trainer_row(s, all_one(zeros.get(s, 0))) for s in range(1, STEPS + 1)]
    f = diagnose(load_run(write_run(tmp_path / "run", rows)))[0]
    assert f.code == "reward_constant" and f.evidence.startswith("in 29 of 30 steps (97%)")
    assert f.evidence.endswith("the other steps: 1")
    # one pinned step fewer than 90%: 26 of 30 (87%) is a reward that varies, not a constant one
    zeros = {1: 2, 4: 2, 7: 2, 19: 2}
    rows = [trainer_row(s, all_one(zeros.get(s, 0))) for s in range(1, STEPS + 1)]
    assert "reward_constant" not in [f.code for f in diagnose(load_run(write_run(tmp_path / "varies", rows)))]


def test_a_run_that_rose_to_solve_every_group_converged(tmp_path: Path) -> None:
    # step s: the first min(16, s) groups solved (all 1), the others half right (4 of 8): solved share s / 16,
    # >= 90% only from step 15 on: 16 of 30 steps pinned (53% < 90%). Mean reward of steps 1-10:
    # 0.5 + 0.5 * 5.5 / 16 = 0.672, far from 1: the run learned. Its zero-std groups are solved (converged).
    def groups(s: int) -> list[list[float | None]]:
        return [[1.0] * G if g < s else [1.0, 0.0] * (G // 2) for g in range(P)]

    rows = [trainer_row(s, groups(s)) for s in range(1, STEPS + 1)]
    path = write_run(tmp_path / "run", rows)
    assert diagnose(load_run(path)) == []
    assert main(["doctor", str(path), "--fail-on", "warning"]) == 0
    # the live monitor says it converged, as before: zero-std groups are over 80% from step 13 (13/16), the
    # window's mean from step 18; every one of them solved
    assert [(lvl, m) for _, lvl, m in live_events(rows)] == [("info", "zero_std_groups")]


def test_a_real_short_run_with_a_saturated_reward(tiny_model_dir, tmp_path: Path) -> None:
    """A real `Trainer` run (12 steps of 2 prompts x 4 completions, algo.beta=0.04) whose reward is 1 for every
    completion but the very first: the doctor names reward_constant; the live monitor warns, never "Converged"."""
    from grpokit.train import Trainer
    from helpers.runs import ROWS, tiny_cfg

    calls = [0]

    def almost_one(prompts, completions, **kw):
        out = [1.0] * len(completions)
        if calls[0] == 0:
            out[0] = 0.0
        calls[0] += 1
        return out

    cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{"train.steps": 12, "algo.beta": 0.04})
    cfg.data.dataset = ""  # rows are passed directly
    Trainer(cfg, reward_funcs=[almost_one], train_rows=ROWS, eval_rows=[], quiet=True).train()
    run = load_run(tmp_path / "run")
    # step 1: 1 of 2 groups solved (not pinned); steps 2-12 pinned at 1: 11 of 12 (92% >= 90%); steps 1-4 (12 // 3)
    # mean reward (7/8 + 3) / 4 = 0.969, 0.031 from 1: from the start
    found = [f.code for f in diagnose(run)]  # (the 2-layer test model also truncates at 6 tokens, and spikes)
    assert found[0] == "reward_constant" and "zero_std_groups" not in found
    assert any(r.get("grad_norm", 0.0) > 0 for r in run.metrics)  # the KL term: zero_grad_steps could not say it
    assert not [e for e in run.events if str(e.get("message", "")).startswith("Converged")]
    assert main(["doctor", str(tmp_path / "run"), "--fail-on", "warning"]) == 1
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 12


def k_of_8(k: int) -> list[list[float | None]]:
    """Every group: k completions 1.0, the others 0.0 (mean reward k / 8, no group solved unless k = 8)."""
    return [[1.0] * k + [0.0] * (G - k) for _ in range(P)]


def test_a_run_that_learned_fast_is_not_named_pinned(tmp_path: Path) -> None:
    # 100 steps: mean reward 2/8 = 0.25, 5/8 = 0.625, 7/8 = 0.875 at steps 1-3, then every completion 1 (levels
    # the same, range 0-1). Pinned at 1 in 97 of 100 steps (97% >= 90%). Steps 1-10 (window 10): mean level
    # (0.25 + 0.625 + 0.875 + 7) / 10 = 0.875 >= 0.85, so the mean rule named it "pinned at 1 from the first
    # steps" (error). Every early step, the lowest set aside: the second lowest is 0.625 < 0.85: it learned.
    rows = [trainer_row(s, k_of_8({1: 2, 2: 5, 3: 7}.get(s, 8))) for s in range(1, 101)]
    path = write_run(tmp_path / "run", rows)
    assert "reward_constant" not in [f.code for f in diagnose(load_run(path))]
    # the live monitor: its groups without signal are solved (converged, info), never waste (a warning)
    assert ("warning", "zero_std_groups") not in [(lvl, m) for _, lvl, m in live_events(rows)]


def test_one_outlier_step_among_the_first_does_not_hide_a_pinned_reward(tmp_path: Path) -> None:
    # as above but with one bad batch: step 5 at 4/8 = 0.5 (no group solved), every other step all 1. Pinned
    # at 1 in 99 of 100 steps; steps 1-10: nine levels 1 and one 0.5; the lowest set aside (one in 10), the
    # floor is 1 >= 0.85: from the start. The min rule alone would have called it learned.
    rows = [trainer_row(s, k_of_8(4 if s == 5 else 8)) for s in range(1, 101)]
    found = diagnose(load_run(write_run(tmp_path / "run", rows)))
    assert [f.code for f in found] == ["reward_constant"] and found[0].evidence.startswith("in 99 of 100 steps")
    assert live_events(rows) and ("info", "zero_std_groups") not in [(lvl, m) for _, lvl, m in live_events(rows)]
    # two bad batches among the first 10 (steps 2 and 5, 0.5): the floor is 0.5, the run counts as learned
    rows = [trainer_row(s, k_of_8(4 if s in (2, 5) else 8)) for s in range(1, 101)]
    assert "reward_constant" not in [f.code for f in diagnose(load_run(write_run(tmp_path / "two", rows)))]
