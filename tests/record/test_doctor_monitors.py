"""The doctor's reward-hacking monitors and signal checks, each on a planted run that must trigger it
(and only it), and the costs it reports; the healthy planted run (tests/helpers/doctor_runs.py) and the
real demo run (test_doctor.py) must trigger none of them."""

from __future__ import annotations

import json
from pathlib import Path

from grpokit.record.doctor import diagnose, examine
from grpokit.record.hacking_checks import repetition
from grpokit.record.report_data import load_run
from helpers.doctor_runs import codes, healthy_rows, sick, write_run


def test_reward_std_death(tmp_path: Path) -> None:
    # the spread within groups 0.3 -> 0 from step 21 with the reward stuck at 0.3 (30% of its 0..1 range)
    run = sick(tmp_path, reward_std=0.0, reward=0.3, **{"rewards/math/mean": None, "rewards/format/mean": None})
    found = diagnose(load_run(run))
    assert [f.code for f in found] == ["reward_std_death"] and "reward_std 0.3 -> 0 (steps 1-10 vs 51-60)" in found[
        0
    ].evidence
    # the same death at 95% of the range is a solved task, not a death
    assert codes(sick(tmp_path / "b", reward_std=0.0, reward=0.95, **{"completions/frac_groups_solved": 0.9})) == []


def test_steps_with_exactly_zero_gradient(tmp_path: Path) -> None:
    # steps 21-30 with grad_norm 0.0: 10 of 60 = 17% >= zero_grad_share 10%
    found = diagnose(load_run(sick(tmp_path, grad_norm=lambda s, r: 0.0 if s <= 30 else r["grad_norm"])))
    assert [f.code for f in found] == ["zero_grad_steps"]
    # their groups had signal (frac_reward_zero_std ~0.3) and no truncation mask is on: neither cause is claimed
    assert found[0].evidence == (
        "grad_norm is exactly 0 at 10 of 60 steps (17%); at 10 of them (steps 21, 22, 23, 24, 25, 26, 27, 28 ...) "
        "groups had signal (frac_reward_zero_std < 1) and still no gradient"
    )
    assert "dynamic sampling" not in found[0].advice
    assert found[0].steps == (21, 30) and found[0].panel == "grad-norm"
    assert codes(sick(tmp_path / "b", grad_norm=lambda s, r: 0.0 if s == 40 else r["grad_norm"])) == []  # one step


def test_kl_pinned_at_a_ceiling(tmp_path: Path) -> None:
    # KL grows 0.01 x 1.2^(s-20) and is clamped at 0.5 (below kl_max 1.0) from step 42 on
    found = diagnose(load_run(sick(tmp_path, kl=lambda s, r: min(0.01 * 1.2 ** (s - 20), 0.5))))
    assert [f.code for f in found] == ["kl_pinned"] and "kl stays at 0.5" in found[0].evidence
    assert "from step 42 to the end" in found[0].evidence  # 0.01 x 1.2^22 = 0.55 > 0.5, 1.2^21 = 0.46
    # a KL flat from the first step is no clamp
    assert codes(write_run(tmp_path / "flat", [r | {"kl": 0.5} for r in healthy_rows()])) == []
    # the run's own clamp (algo.kl_clamp=0.2): a recent KL of 0.19 (>= 90% of it) is pinned at it
    run = sick(tmp_path / "clamp", kl=lambda s, r: min(0.01 * 1.2 ** (s - 20), 0.19))
    (run / "config.yaml").write_text("algo:\n  kl_clamp: 0.2\n")
    found = diagnose(load_run(run))
    assert [f.code for f in found] == ["kl_pinned"] and "recent kl 0.19 at algo.kl_clamp=0.2 (steps 51-60)" in found[
        0
    ].evidence


def test_plateau(tmp_path: Path) -> None:
    rows = healthy_rows()
    for r in rows:  # reward, its components and held-out accuracy all flat from the first step: nothing learned
        r |= {"reward": 0.3, "rewards/math/mean": 0.2, "rewards/format/mean": 0.5}
        r |= {"eval/accuracy": 0.3} if "eval/accuracy" in r else {}
    found = diagnose(load_run(write_run(tmp_path / "run", rows)))
    assert [f.code for f in found] == ["plateau"] and "over steps 31-60" in found[0].evidence


def test_clip_asymmetry(tmp_path: Path) -> None:
    found = diagnose(load_run(sick(tmp_path, **{"clip_ratio/high_mean": 0.09, "clip_ratio/low_mean": 0.005})))
    assert [f.code for f in found] == ["clip_asymmetry"] and "upper side" in found[0].title
    assert "algo.clip_high" in found[0].advice
    found = diagnose(load_run(sick(tmp_path / "b", **{"clip_ratio/high_mean": 0.002, "clip_ratio/low_mean": 0.08})))
    assert [f.code for f in found] == ["clip_asymmetry"] and "lower side" in found[0].title


def test_a_clip_range_too_narrow(tmp_path: Path) -> None:
    # epsilon 0.0005 and 15% of tokens clipped (> clip_asymmetry_min 0.05, both sides alike): a narrow trust region
    run = sick(tmp_path, **{"clip_ratio/region_mean": 0.15, "clip_ratio/low_mean": 0.07, "clip_ratio/high_mean": 0.08})
    (run / "config.yaml").write_text("algo:\n  clip_low: 0.0005\n  clip_high: 0.0005\n")
    found = diagnose(load_run(run))
    assert [f.code for f in found] == ["tight_clip"] and "15% of tokens clipped (steps 51-60)" in found[0].evidence
    (run / "config.yaml").write_text("algo:\n  clip_low: 0.2\n  clip_high: 0.2\n")  # the usual range: no finding
    assert codes(run) == []


def test_same_length_groups_from_filler(tmp_path: Path) -> None:
    # a length reward gamed: 90% of groups have one length for all completions (same_length_max 0.5)
    found = diagnose(load_run(sick(tmp_path, **{"completions/frac_groups_same_length": 0.9})))
    assert [f.code for f in found] == ["same_length_groups"] and "90% of groups" in found[0].evidence


def test_repetition_read_from_samples(tmp_path: Path) -> None:
    # "a b c d e f g h" has 5 distinct 4-grams of 5: 0; "x y z w" x 10 has 4 distinct of 37: 1 - 4/37 = 0.89
    assert repetition("a b c d e f g h") == 0.0 and abs(repetition("x y z w " * 10) - (1 - 4 / 37)) < 1e-9
    run = write_run(tmp_path / "run", healthy_rows())
    comp = lambda t: {"text": t, "reward": 1.0}  # noqa: E731
    rows = [
        {"step": 10, "prompt": "p", "completions": [comp("the sum of two and three is five, so five"), comp("5")]},
        {"step": 60, "prompt": "p", "completions": [comp("the answer is five " * 20), comp("five five " * 30)]},
    ]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = diagnose(load_run(run))
    assert [f.code for f in found] == ["repetition"] and "(step 10: 0%)" in found[0].evidence


def test_components_diverge(tmp_path: Path) -> None:
    # math 0.1 -> 0.7 while format 0.9 -> 0.3 (the policy trades one for the other); held-out rises
    run = sick(tmp_path, **{"rewards/format/mean": lambda s, r: 0.9 - 0.6 * (s - 20) / 40})
    found = diagnose(load_run(run))
    assert [f.code for f in found] == ["reward_components_diverge"] and "math rises while format falls" in found[
        0
    ].title


def test_a_constant_reward_component(tmp_path: Path) -> None:
    # format scores 1.0 for every completion at every step (std 0) while math varies: a term that teaches nothing
    rows = [
        r | {"rewards/format/mean": 1.0, "rewards/format/std": 0.0, "rewards/math/std": 0.3} for r in healthy_rows()
    ]
    found = diagnose(load_run(write_run(tmp_path / "run", rows)))
    assert [f.code for f in found] == ["constant_component"] and "format scores every completion 1" in found[0].title
    rows = [r | {"rewards/format/std": 0.2, "rewards/math/std": 0.3} for r in healthy_rows()]  # both vary: quiet
    assert codes(write_run(tmp_path / "ok", rows)) == []


def test_entropy_near_zero_from_the_start(tmp_path: Path) -> None:
    # a near-greedy sampler: entropy 0.01 from step 1 (below entropy_min 0.05), reward flat at 0.3
    rows = [
        r | {"entropy": 0.01, "reward": 0.3, "rewards/math/mean": 0.2, "rewards/format/mean": 0.5}
        for r in healthy_rows()
    ]
    run = write_run(tmp_path / "run", rows, config="rollout:\n  temperature: 0.05\n")
    found = diagnose(load_run(run))
    assert [f.code for f in found] == ["entropy_collapse"] and found[0].title.startswith(
        "Entropy is near zero from the first"
    )
    assert "raise rollout.temperature (now 0.05)" in found[0].advice


def test_groups_too_small(tmp_path: Path) -> None:
    # G=2 with 60% of groups all alike over the run (>= zero_std_share 0.5), most of them solved
    rows = [r | {"frac_reward_zero_std": 0.6, "completions/frac_groups_solved": 0.5} for r in healthy_rows()]
    run = write_run(tmp_path / "g2", rows, config="rollout:\n  group_size: 2\n")
    found = diagnose(load_run(run))
    assert [f.code for f in found] == ["small_group"] and "2.5 rollouts paid per useful one" in found[0].evidence
    assert codes(write_run(tmp_path / "g8", rows)) == []  # the same shares at G=8: no finding of group size


def test_cost_notes(tmp_path: Path) -> None:
    # held-out accuracy best at step 20 (0.8), flat after; time/step 2 s: 40 steps, 80 s after it
    run = sick(tmp_path, **{"eval/accuracy": lambda s, r: 0.8 if "eval/accuracy" in r else None})
    rows = [r | ({"eval/accuracy": 0.5} if r["step"] == 10 else {}) for r in json_rows(run)]
    write_run(run, rows)
    notes = {n.code: n for n in examine(load_run(run)).notes}
    assert notes["after_last_improvement"].text == (
        "40 of 60 steps (67%), 80 s, ran after the last held-out improvement (step 20, accuracy 0.8)"
    )
    assert notes["rollouts_per_useful"].text.startswith("1.4 rollouts paid per useful one")


def test_resume_from_the_last_checkpoint_before_the_onset(tmp_path: Path) -> None:
    run = sick(tmp_path, kl=lambda s, r: 0.01 * 1.2 ** (s - 20))  # kl passes 1.0 at step 46 (0.01 x 1.2^26 = 1.14)
    for step in (20, 40, 50):
        (run / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    notes = {n.code: n for n in examine(load_run(run)).notes}
    assert (
        notes["resume_from"].text
        == "the run went bad at step 46: resume from the checkpoint of step 40, the last saved before the onset"
    )
    assert notes["resume_from"].evidence.startswith("kl 1.14 > health.kl_max 1")
    assert "resume_from" not in {n.code for n in examine(load_run(write_run(tmp_path / "h", healthy_rows()))).notes}
    # bad from the start (held-out 0.8 before training, 0.1 at the first evaluation): restart, not resume
    rows = [r | ({"eval/accuracy": 0.1} if "eval/accuracy" in r else {}) for r in healthy_rows()]
    rows = [r | {"reward": 0.3, "rewards/math/mean": 0.2, "rewards/format/mean": 0.5} for r in rows]
    run = write_run(tmp_path / "start", rows)
    (run / "summary.json").write_text(json.dumps({"eval_before": {"accuracy": 0.8}, "steps": 60}))
    notes = {n.code: n for n in examine(load_run(run)).notes}
    assert notes["resume_from"].text.startswith("the run went bad at step 1: nothing before it is worth keeping")


def json_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
