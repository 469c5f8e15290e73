"""Completions that no reward function scored (every one answered None, "not applicable") are named, per
function, ranked above the constant-reward and zero-std findings they explain; a None that another function
makes up for (TRL's multi-task rewards, a domain's rewards off its domain) is no finding (hunter's issue C).
Runs are metrics.jsonl lines as the trainer writes them (helpers.doctor_runs.trainer_row), 16 groups of 8."""

from __future__ import annotations

from pathlib import Path

from grpokit.record.doctor import diagnose
from grpokit.record.report_data import load_run
from helpers.doctor_runs import trainer_row, write_run

P, G, STEPS = 16, 8, 20


def test_a_function_that_answers_none_for_everything(tmp_path: Path) -> None:
    rows = [trainer_row(s, [[None] * G for _ in range(P)]) for s in range(1, STEPS + 1)]
    found = diagnose(load_run(write_run(tmp_path / "run", rows)))
    assert [f.code for f in found] == ["unscored_completions", "reward_constant"]
    first, second = found
    assert first.title == "No completion was scored: every reward function answered None (not applicable)"
    # 128 completions a step x 20 steps, none scored
    assert (
        first.evidence
        == "2560 of 2560 completions over steps 1-20 had no score; f answered None for 2560 of 2560 (100%)"
    )
    assert first.level == "error" and first.panel == "faults"
    # the constant reward is said as what it is: no completion was scored, not "scored the same"
    assert second.title == "The reward is always 0 because no completion was ever scored: nothing can be learned"
    assert "ever scored differently" not in second.title and "the sum of no score" in second.evidence


def test_most_completions_unscored(tmp_path: Path) -> None:
    # 15 of 16 groups all None; group 0 scored half right (1, 0, 1, 0 ...): 120 of 128 unscored a step (94%);
    # the 15 unscored groups are flat (0 for all, counted as 0): the zero-std findings follow, ranked below
    def groups() -> list[list[float | None]]:
        return [[1.0, 0.0] * (G // 2) if g == 0 else [None] * G for g in range(P)]

    rows = [trainer_row(s, groups(), grad_norm=0.0 if s % 2 else 0.1) for s in range(1, STEPS + 1)]
    found = diagnose(load_run(write_run(tmp_path / "run", rows)))
    assert found[0].code == "unscored_completions" and found[0].score > max(f.score for f in found[1:])
    assert found[0].title == "94% of completions got no reward: every reward function answered None for them"
    assert found[0].evidence.startswith("2400 of 2560 completions over steps 1-20 had no score")
    assert {"zero_std_groups", "zero_grad_steps"} <= {f.code for f in found[1:]}


def test_none_that_another_function_makes_up_for_is_no_finding(tmp_path: Path) -> None:
    # "extra" answers None for every completion, "f" scores them all (TRL's multi-task convention): every
    # completion has a reward (rewards/unscored 0), so nothing is unscored
    def groups(s: int) -> list[list[float | None]]:
        return [[1.0 if (g + j + s) % 3 else 0.0 for j in range(G)] for g in range(P)]

    rows = [trainer_row(s, groups(s)) | {"rewards/extra/not_applicable": float(P * G)} for s in range(1, STEPS + 1)]
    assert "unscored_completions" not in [f.code for f in diagnose(load_run(write_run(tmp_path / "multi", rows)))]
    # two domains (rewards named <domain>/<function>), each None for the other's half: no completion unscored
    rows = [
        {k: v for k, v in r.items() if not k.startswith("rewards/extra")}
        | {"rewards/math/acc/not_applicable": 64.0, "rewards/calc/acc/not_applicable": 64.0}
        for r in rows
    ]
    assert "unscored_completions" not in [f.code for f in diagnose(load_run(write_run(tmp_path / "domains", rows)))]


def test_a_run_from_before_the_unscored_count(tmp_path: Path) -> None:
    # no rewards/unscored: with one function its None is the completion's (3 of 8 per group: 37.5% > 10%)
    def groups() -> list[list[float | None]]:
        return [[None, None, None, 1.0, 0.0, 1.0, 0.0, 1.0] for _ in range(P)]

    rows = [{k: v for k, v in trainer_row(s, groups()).items() if k != "rewards/unscored"} for s in range(1, 11)]
    found = {f.code: f for f in diagnose(load_run(write_run(tmp_path / "one", rows)))}
    assert found["unscored_completions"].title.startswith("38% of completions got no reward")
    assert found["unscored_completions"].level == "warning"  # under half: 0.6
    # ... with two functions it cannot tell which completions the other scored: no finding rather than a guess
    rows = [r | {"rewards/g/not_applicable": 0.0} for r in rows]
    assert "unscored_completions" not in {f.code for f in diagnose(load_run(write_run(tmp_path / "two", rows)))}
