"""`grpokit doctor`: each finding named on a tiny run made to show it (and nothing else), silence on
healthy runs (a synthetic one and the real default demo run recorded in tests/golden)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.record.doctor import DoctorConfig, diagnose
from grpokit.record.report import render_report
from grpokit.record.report_data import load_run
from helpers.doctor_runs import STEPS, codes, first_live_step, healthy_rows, sick, write_run
from helpers.paths import TESTS

GOLDEN = TESTS / "golden" / "default_run_metrics.json"


def test_healthy_synthetic_run_says_nothing(tmp_path: Path) -> None:
    assert codes(write_run(tmp_path / "run", healthy_rows())) == []


def test_real_default_demo_run_says_nothing(tmp_path: Path) -> None:
    """The default demo run (60 steps, 22.8% -> 99% held-out) recorded before the layout change."""
    rows = [r | {"step": i} for i, r in enumerate(json.loads(GOLDEN.read_text()), 1)]
    run = write_run(tmp_path / "demo", rows)
    (run / "summary.json").write_text(
        json.dumps({"eval_before": {"accuracy": 0.228}, "eval_after": {"accuracy": 0.99}, "steps": 60})
    )
    assert codes(run) == []
    assert "The doctor found nothing to fix" in render_report(run)


def test_a_real_short_demo_run_says_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`grpokit train` of the demo for 20 steps (about 10 s on one CPU core; 22.8% -> ~97% held out):
    the metrics every check reads are there, and the doctor, in the terminal and in the report, is silent."""
    run = tmp_path / "demo"
    assert main(["train", "--out", str(run), "train.steps=20"]) == 0
    logged = {k for r in load_run(run).metrics for k in r}
    read = {
        "reward",
        "rewards/arithmetic_accuracy/mean",
        "rewards/failed_fraction",
        "rewards/arithmetic_accuracy/failures",
        "rewards/arithmetic_accuracy/timeouts",
        "entropy",
        "frac_reward_zero_std",
        "completions/frac_groups_solved",
        "completions/mean_length",
        "completions/max_length",
        "completions/clipped_ratio",
        "completions/reward_max",
        "clip_ratio/region_mean",
        "grad_norm",
        "loss",
        "time/reward",
        "time/step",
        "eval/accuracy",
    }
    assert read <= logged, read - logged
    capsys.readouterr()
    assert main(["doctor", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"grpokit doctor: {run}: nothing to fix found."
    assert "ran after the last held-out improvement" in out and "not checked: held-out" not in out
    assert "The doctor found nothing to fix" in (run / "report.html").read_text()


def test_the_report_shows_the_findings_first(tmp_path: Path) -> None:
    html = render_report(sick(tmp_path, **{"completions/clipped_ratio": 0.4}))
    top = html.index("<h2>Doctor</h2>")
    assert (
        top
        < html.index('class="finding sev2"><b>1. Many completions are cut at the length limit</b>')
        < html.index("<h2>Training curves")
    )
    assert "40% of completions truncated (steps 51-60)" in html and "try: raise rollout.max_new_tokens (now 64)" in html


def test_every_config_field_the_advice_names_exists() -> None:
    """A change to try must be one the user can make: every `section.field` in the doctor's advice is a config field."""
    import grpokit.record.cost as cost
    import grpokit.record.hacking_checks as hacking
    import grpokit.record.learning_checks as learning
    import grpokit.record.signal_checks as signal
    import grpokit.record.stability_checks as stability
    from grpokit.config.sections import Config

    text = "".join(Path(m.__file__).read_text() for m in (learning, stability, signal, hacking, cost))
    named = set(re.findall(r"\b(algo|rollout|reward|train|optim|model|env|data)\.([a-z_]+)\b", text))
    assert len(named) > 15
    # the sampler/trainer mismatch fields, named only to runs whose config has them (test_sampler_trainer_mismatch)
    optional = {("rollout", "mismatch_mask"), ("rollout", "mismatch_low"), ("rollout", "mismatch_high")}
    missing = [f"{sec}.{name}" for sec, name in named - optional if not hasattr(getattr(Config(), sec), name)]
    assert missing == [], missing


def test_reward_up_heldout_flat(tmp_path: Path) -> None:
    # eval/accuracy 0.4 at steps 10..60 while reward 0.2 -> 0.8: gain 0 <= 0.02
    assert codes(sick(tmp_path, **{"eval/accuracy": lambda s, r: 0.4 if "eval/accuracy" in r else None})) == [
        "reward_hacking_heldout"
    ]


def test_reward_hacking_findings_quote_the_best_recent_sample(tmp_path: Path) -> None:
    run = sick(tmp_path, **{"eval/accuracy": lambda s, r: 0.4 if "eval/accuracy" in r else None})
    comp = lambda text, reward: {"text": text, "reward": reward}  # noqa: E731
    rows = [
        {"step": 50, "prompt": "1+1=", "completions": [comp("<answer>2</answer>", 1.0)]},
        {
            "step": 60,
            "prompt": "2+2=",
            "completions": [comp("<answer>5</answer>", 0.0), comp("<answer> " + "4 " * 80, 0.9)],
        },
        {"step": 60, "prompt": "3+3=", "completions": [comp("<answer>6</answer>", float("nan"))]},
    ]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = diagnose(load_run(run))
    # step 60's best (NaN left out): 0.9, its text with whitespace collapsed, cut at 120 characters
    assert found[0].evidence.endswith('; best sample of step 60 (reward 0.9): "<answer> ' + ("4 " * 56)[:111] + '..."')


def test_heldout_from_summary(tmp_path: Path) -> None:
    run = sick(tmp_path, **{"eval/accuracy": None})
    (run / "summary.json").write_text(json.dumps({"eval_before": {"accuracy": 0.5}, "eval_after": {"accuracy": 0.45}}))
    findings = diagnose(load_run(run))
    assert [f.code for f in findings] == ["reward_hacking_heldout"]
    assert "held-out accuracy 0.5 (step 0) -> 0.45 (step 60)" in findings[0].evidence


def test_heldout_accuracy_falls(tmp_path: Path) -> None:
    # reward flat at 0.3 (early ~0.25, recent 0.3: +0.05 is not > reward_flat_tol) while eval falls 0.8 -> 0.2
    run = sick(
        tmp_path,
        reward=lambda s, r: 0.3 if s > 20 else 0.25,
        **{
            "rewards/math/mean": None,
            "rewards/format/mean": None,
            "eval/accuracy": lambda s, r: 1 - s / 60 if "eval/accuracy" in r else None,
        },
    )
    found = diagnose(load_run(run))
    assert [f.code for f in found] == ["heldout_drop"] and "0.833 (step 10) -> 0 (step 60)" in found[0].evidence


def test_one_component_rising_alone(tmp_path: Path) -> None:
    # format 0.1 -> 0.9 while math stays 0.1; no held-out evaluation to say otherwise
    run = sick(
        tmp_path, **{"eval/accuracy": None, "rewards/math/mean": 0.1, "rewards/format/mean": lambda s, r: s / STEPS}
    )
    rows = json.loads("[" + ",".join((run / "metrics.jsonl").read_text().split("\n")[:-1]) + "]")
    for r in rows[:20]:
        r["rewards/math/mean"], r["rewards/format/mean"] = 0.1, r["step"] / STEPS
    write_run(run, rows)
    assert codes(run) == ["format_over_accuracy"]  # a shaping term (by its name) rising alone: named as such
    for r in rows:  # the same rise by a term whose name says nothing of format: one component rising alone
        r["rewards/brevity/mean"] = r.pop("rewards/format/mean")
    write_run(run, rows)
    assert codes(run) == ["reward_component_alone"]


def test_length_rising_with_reward_but_not_with_heldout_accuracy(tmp_path: Path) -> None:
    # mean length 50 -> 50 + 3 * (60 - 20) = 170 tokens (early 50, recent ~158: x3.2 > 1.5), max length follows
    grow = {
        "completions/mean_length": lambda s, r: 50 + 3 * (s - 20),
        "completions/max_length": lambda s, r: 64 + 3 * (s - 20),
    }
    # the reward rises with it (0.2 -> 0.8): the live alarm is quiet; with no held-out evaluation to show
    # that longer answers pay, the doctor's own check asks for one
    assert codes(sick(tmp_path, **grow, **{"eval/accuracy": None})) == ["length_with_reward"]
    assert codes(sick(tmp_path / "b", **grow)) == []  # held-out accuracy rises too: longer reasoning that pays
    # the reward flat at 0.5 over the whole run while the length grows from step 21
    rows = [r | {"reward": 0.5} for r in healthy_rows()]
    for r in rows:
        r.pop("rewards/math/mean"), r.pop("rewards/format/mean")
        if r["step"] > 20:
            r |= {k: f(r["step"], r) for k, f in grow.items()}
    run = write_run(tmp_path / "c", rows)
    # the live length_inflation alarm's rule (length x3.2 > 1.5, reward moved 0 < 0.05), whatever held-out says
    assert codes(run) == ["length_growth"] and first_live_step(rows, "length_inflation") is not None


def test_entropy_collapse_before_learning(tmp_path: Path) -> None:
    # entropy 0.5 -> 0.01 (< 0.2 x early) with the reward flat at 0.3: 30% of its 0..1 range, below 0.85
    run = sick(
        tmp_path,
        entropy=0.01,
        reward=0.3,
        **{"rewards/math/mean": None, "rewards/format/mean": None, "eval/accuracy": None},
    )
    assert codes(run) == ["entropy_collapse"]


def test_zero_std_groups(tmp_path: Path) -> None:
    # 95% of groups without signal, none solved: recent 0.95 > zero_std_max 0.8
    found = diagnose(load_run(sick(tmp_path, frac_reward_zero_std=0.95, **{"completions/frac_groups_solved": 0.0})))
    assert [f.code for f in found] == ["zero_std_groups"] and "group_size=8" in found[0].advice


def test_truncated_completions(tmp_path: Path) -> None:
    found = diagnose(load_run(sick(tmp_path, **{"completions/clipped_ratio": 0.4})))
    assert [f.code for f in found] == ["truncated"] and "max_new_tokens (now 64)" in found[0].advice


def test_kl_and_clip_runaway(tmp_path: Path) -> None:
    assert codes(sick(tmp_path, kl=lambda s, r: 0.01 * 1.2 ** (s - 20))) == ["kl_clip_runaway"]  # 0.01 x 1.2^40 = 15
    assert codes(sick(tmp_path / "b", **{"clip_ratio/region_mean": 0.5})) == ["kl_clip_runaway"]


def test_grad_norm_spikes(tmp_path: Path) -> None:
    found = diagnose(load_run(sick(tmp_path, grad_norm=lambda s, r: 50.0 if s in (30, 45) else r["grad_norm"])))
    assert (
        [f.code for f in found] == ["grad_spikes"]
        and "step 30: 50" in found[0].evidence
        and "step 45: 50" in found[0].evidence
    )


def test_a_spike_in_one_of_a_steps_updates_is_read_from_grad_norm_max(tmp_path: Path) -> None:
    """Two updates a step: at step 30 one update's norm is 50 and the other's 1.0, so grad_norm (their mean)
    is 25.5 and grad_norm/max 50. Both are spikes over the median ~1; the doctor quotes the max (50)."""
    mean = lambda s, r: 25.5 if s == 30 else r["grad_norm"]  # noqa: E731
    largest = lambda s, r: 50.0 if s == 30 else r["grad_norm"]  # noqa: E731
    run = sick(tmp_path, **{"grad_norm": mean, "grad_norm/max": largest})
    found = diagnose(load_run(run))
    assert [f.code for f in found] == ["grad_spikes"] and "step 30: 50" in found[0].evidence


def test_non_finite_steps(tmp_path: Path) -> None:
    rows = healthy_rows()
    rows[32]["loss"] = float("nan")  # step 33; the trainer skipped that update
    found = diagnose(load_run(write_run(tmp_path / "run", rows)))
    # one skipped update of 60 (1 in a row, 1/60 < nonfinite_share 0.1 and fewer than max_nonfinite_steps 3): a warning
    assert [(f.code, f.level) for f in found] == [("nonfinite_updates", "warning")]
    assert found[0].evidence == "loss or grad_norm non-finite at 1 of 60 steps (33)"
    (tmp_path / "run" / "config.yaml").write_text("health:\n  nonfinite_keys: [grad_norm]\n")  # the live alarm's keys
    assert codes(tmp_path / "run") == []


def test_sampler_trainer_mismatch(tmp_path: Path) -> None:
    # the names algo/tis.py logs; each one's limit: |log r| mean 0.05, k3 KL 0.005, outside share 0.01
    found = diagnose(load_run(sick(tmp_path, **{"mismatch/logp_abs_diff_mean": 0.2, "mismatch/k3_kl": 0.02})))
    assert [f.code for f in found] == ["sampler_mismatch"]
    assert (
        "mismatch/logp_abs_diff_mean 0.2 > 0.05 (steps 51-60)" in found[0].evidence
        and "mismatch/k3_kl 0.02 > 0.005" in found[0].evidence
    )
    assert "mismatch_mask" not in found[0].advice  # this run's config has no rollout.mismatch_mask: not advised
    run = sick(tmp_path / "b", **{"mismatch/outside_fraction": 0.03})
    (run / "config.yaml").write_text("rollout:\n  mismatch_mask: none\n")
    found = diagnose(load_run(run))
    assert [f.code for f in found] == ["sampler_mismatch"] and "rollout.mismatch_mask=token" in found[0].advice
    assert codes(sick(tmp_path / "c", **{"tis/logp_abs_diff_mean": 0.1})) == ["sampler_mismatch"]
    # a healthy bf16 sampler: small means, one far-off token per step (the max), nothing masked: silence
    quiet = {
        "mismatch/logp_abs_diff_mean": 0.01,
        "mismatch/k3_kl": 0.0005,
        "mismatch/outside_fraction": 0.001,
        "mismatch/logp_abs_diff_max": 0.9,
        "mismatch/masked_fraction": 0.0,
        "tis/ratio_max": 3.0,
    }
    assert codes(sick(tmp_path / "d", **quiet)) == []


def test_reward_failures_and_timeouts(tmp_path: Path) -> None:
    found = diagnose(load_run(sick(tmp_path, **{"rewards/failed_fraction": 0.3, "rewards/math/failures": 5.0})))
    # 0% in steps 1-10, 30% in 51-60: a failure rate that rose with training (the policy breaking the verifier?)
    assert [f.code for f in found] == ["verifier_failures_rising"] and "math: 200 failures" in found[0].evidence
    assert "rewards/failed_fraction 0.0% -> 30.0% (steps 1-10 vs 51-60)" in found[0].evidence
    assert found[0].severity == 3
    rows = healthy_rows()  # the same failures from the first step on: a failing function, not a rising rate
    for r in rows:
        r["rewards/failed_fraction"], r["rewards/math/failures"] = 0.3, 5.0
    found = diagnose(load_run(write_run(tmp_path / "flat", rows)))
    assert [f.code for f in found] == ["reward_failures"] and "math: 300 failures" in found[0].evidence
    assert found[0].severity == 3  # run mean 30% > reward_failure_max 10%


def test_reward_time_outs(tmp_path: Path) -> None:
    # 4 of math's failures per step are time-outs (failures count them too): 40 steps x 4 = 160
    found = diagnose(
        load_run(
            sick(
                tmp_path,
                **{"rewards/failed_fraction": 0.05, "rewards/math/failures": 4.0, "rewards/math/timeouts": 4.0},
            )
        )
    )
    assert [f.code for f in found] == ["reward_failures"] and found[0].title == "Reward functions time out"
    assert "math: 160 failures, 160 of them time-outs" in found[0].evidence and "reward.timeout_s" in found[0].advice
    assert found[0].severity == 1  # run mean 40/60 x 5% = 3.3% <= reward_failure_max 10%
    # NaN scores: 2 per step from step 21 (40 steps x 2 = 80), named with what to change
    found = diagnose(
        load_run(
            sick(
                tmp_path / "b",
                **{"rewards/failed_fraction": 0.05, "rewards/math/failures": 2.0, "rewards/math/nonfinite": 2.0},
            )
        )
    )
    assert "math: 80 failures, 80 non-finite" in found[0].evidence and "return finite numbers" in found[0].advice
    assert found[0].title == "Reward functions fail" and "timeout_s" not in found[0].advice


def test_tool_errors_time_outs_and_failed_resets(tmp_path: Path) -> None:
    # 30% of tool calls failing recently > tool_failure_max 20%
    found = diagnose(load_run(sick(tmp_path, **{"tools/failure_frequency": 0.3})))
    assert [f.code for f in found] == ["env_failures"] and "30% of tool calls failed (steps 51-60)" in found[0].evidence
    assert codes(sick(tmp_path / "b", **{"tools/failure_frequency": 0.1})) == []
    # one failed reset() at steps 30 and 31; tool calls past the limit at step 40 only
    found = diagnose(
        load_run(
            sick(
                tmp_path / "c",
                **{
                    "episodes/reset_failures": lambda s, r: 1.0 if s in (30, 31) else 0.0,
                    "episodes/tool_timeouts_mean": lambda s, r: 0.5 if s == 40 else 0.0,
                },
            )
        )
    )
    assert [f.code for f in found] == ["env_failures"] and found[0].severity == 2
    assert "2 episodes lost to a failed reset() (steps 30-31)" in found[0].evidence
    assert "past env.tool_timeout_s at 1 steps (first: step 40)" in found[0].evidence


def test_throughput_lost_to_padding(tmp_path: Path) -> None:
    # max length 200 from step 21: 1 - (60 x 50) / (20 x 64 + 40 x 200) = 1 - 3000 / 9280 = 68% > 60%
    found = diagnose(load_run(sick(tmp_path, **{"completions/mean_length": 50.0, "completions/max_length": 200.0})))
    assert [f.code for f in found] == ["throughput"] and found[0].title == "Time lost to padding"
    assert "68% of completion token slots are padding" in found[0].evidence


def test_throughput_lost_to_rewards(tmp_path: Path) -> None:
    # 40 steps x 3 s + 20 x 0.1 s = 122 s of 60 x 2.0 + 40 x 3.0 = 240 s: 51% > 25%
    run = sick(tmp_path, **{"time/reward": 3.0, "time/step": lambda s, r: 5.0})
    assert codes(run) == ["throughput"]


def test_a_short_runs_few_seconds_of_rewards_are_not_time_lost(tmp_path: Path) -> None:
    # the 20-step demo on a loaded machine: 0.043 s of rewards in each 0.158 s step, 27% > 25%, but 60 x 0.043 =
    # 2.6 s in all, under reward_time_min_s = 10 s; ten times the seconds (25.8 s) is a finding
    def run(name: str, scale: float) -> Path:
        rows = [r | {"time/reward": 0.043 * scale, "time/step": 0.158 * scale} for r in healthy_rows()]
        return write_run(tmp_path / name, rows)

    assert "throughput" not in codes(run("short", 1.0))
    found = [f for f in diagnose(load_run(run("long", 10.0))) if f.code == "throughput"]
    assert found and found[0].evidence == "reward functions took 27% of step time (25.8 of 94.8 s)"


def test_findings_are_ranked_and_thresholds_follow_the_runs_health_config(tmp_path: Path) -> None:
    run = sick(
        tmp_path,
        frac_reward_zero_std=0.95,
        **{
            "completions/frac_groups_solved": 0.0,
            "completions/clipped_ratio": 0.4,
            "eval/accuracy": lambda s, r: 0.4 if "eval/accuracy" in r else None,
        },
    )
    assert codes(run) == ["reward_hacking_heldout", "zero_std_groups", "truncated"]  # scores 0.95, 0.9, 0.7
    # the run's own alarm thresholds are used (recent share 0.95; over the run (20 x 0.3 + 40 x 0.95) / 60 ~ 0.73)
    (run / "config.yaml").write_text("health:\n  zero_std_max: 0.99\n")
    assert "zero_std_groups" in [f.code for f in diagnose(load_run(run))]  # the run's share is still > 0.5
    (run / "config.yaml").write_text("health:\n  zero_std_max: 0.99\n  zero_std_run_max: 0.8\n")
    assert "zero_std_groups" not in [f.code for f in diagnose(load_run(run))]


def test_doctor_and_health_alarms_share_their_thresholds(tmp_path: Path) -> None:
    """Where both watch the same thing, the threshold is HealthConfig's (the run's own health section) and
    DoctorConfig has no field of that name: one number per alarm, never two that disagree."""
    from dataclasses import fields

    from grpokit.config.health import HealthConfig

    assert {f.name for f in fields(DoctorConfig)} & {f.name for f in fields(HealthConfig)} == set()
    run = sick(tmp_path, kl=lambda s, r: 2.0 + 0.01 * (s % 3))  # recent KL ~2.0 > health.kl_max 1.0
    assert codes(run) == ["kl_clip_runaway"]
    (run / "config.yaml").write_text("health:\n  kl_max: 5.0\n")
    assert codes(run) == []


def test_doctor_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = sick(tmp_path, **{"completions/clipped_ratio": 0.4})
    assert main(["doctor", str(run)]) == 0
    out = capsys.readouterr().out
    assert (
        "1. [truncated] Many completions are cut at the length limit" in out
        and "evidence: 40% of completions truncated" in out
    )
    assert main(["doctor", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["findings"][0]["code"] == "truncated" and out["findings"][0]["level"] == "warning"
    assert out["source"] == "grpokit run" and out["steps"] == 60
    assert out["findings"][0]["panel"] == "truncated" and out["findings"][0]["steps"] == [51, 60]
    assert main(["doctor", str(tmp_path / "nope")]) == 2
    assert "does not exist; give a grpokit run folder, a TRL/transformers output_dir" in capsys.readouterr().err
