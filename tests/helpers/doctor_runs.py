"""Planted runs for the doctor's tests: a healthy 60-step run's metrics and ways to make it sick."""

from __future__ import annotations

import json
import random
from pathlib import Path

from grpokit.record.doctor import diagnose
from grpokit.record.report_data import load_run

STEPS = 60


def healthy_rows(n: int = STEPS) -> list[dict]:
    """A run that learns: reward 0.2 -> 0.8 with both components, held-out accuracy rising, steady
    entropy, some zero-std groups, short untruncated completions, small KL and clipping."""
    rng = random.Random(0)
    rows = []
    for step in range(1, n + 1):
        f = step / n
        rows.append(
            {
                "step": step,
                "reward": 0.2 + 0.6 * f + rng.gauss(0, 0.02),
                "rewards/math/mean": 0.1 + 0.6 * f,
                "rewards/format/mean": 0.5 + 0.4 * f,
                "rewards/failed_fraction": 0.0,
                "rewards/math/failures": 0.0,
                "completions/reward_min": 0.0,
                "completions/reward_max": 1.0,
                "completions/frac_groups_solved": 0.1 * f,
                "frac_reward_zero_std": 0.3 + rng.uniform(-0.05, 0.05),
                "entropy": 0.5 - 0.1 * f,
                "completions/mean_length": 50 + rng.uniform(-3, 3),
                "completions/max_length": 64.0,
                "completions/clipped_ratio": 0.01,
                "kl": 0.01 + 0.02 * f,
                "clip_ratio/region_mean": 0.02,
                "clip_ratio/low_mean": 0.008,
                "clip_ratio/high_mean": 0.012,
                "reward_std": 0.3 + 0.02 * (step % 3 - 1),  # no rng: the other values stay as they were
                "completions/frac_groups_same_length": 0.05,
                "grad_norm": 1.0 + rng.uniform(-0.2, 0.2),
                "loss": rng.gauss(0, 0.01),
                "time/reward": 0.1,
                "time/step": 2.0,
            }
            | ({"eval/accuracy": 0.2 + 0.6 * f} if step % 10 == 0 else {})
        )
    return rows


def write_run(path: Path, rows: list[dict], config: str = "rollout:\n  group_size: 8\n  max_new_tokens: 64\n") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "config.yaml").write_text(config)
    return path


def codes(path: Path) -> list[str]:
    return [f.code for f in diagnose(load_run(path))]


def sick(tmp_path: Path, **changes) -> Path:
    """The healthy run with some metrics replaced from step 21 on: {key: value or f(step, row)}, None drops a key."""
    rows = healthy_rows()
    for r in rows:
        for key, value in changes.items():
            if value is None:
                r.pop(key, None)
            elif r["step"] > 20 or key.startswith("eval"):
                r[key] = value(r["step"], r) if callable(value) else value
    return write_run(tmp_path / "run", rows)


def two_domain_run(path: Path, math_acc: list[float], calc_acc: list[float]) -> Path:
    """The healthy run with two domains (data.domains: math, calc) and train.stages (math for steps
    1-30, calc for 31-60): per-domain training metrics every step and held-out accuracy per domain
    before training (summary.json) and at steps 20, 40, 60 (`math_acc` / `calc_acc`: 4 values each)."""
    rows = healthy_rows()
    for r in rows:
        s = r["step"]
        r |= {"stage": 0 if s <= 30 else 1, "domain/math/reward": 0.2 + 0.005 * s, "domain/calc/reward": 0.3}
        r |= {"domain/math/zero_std": 0.3, "domain/calc/zero_std": 0.4}
        if s % 20 == 0:
            i = s // 20
            r |= {"eval/domain/math/accuracy": math_acc[i], "eval/domain/calc/accuracy": calc_acc[i]}
    write_run(path, rows)
    before = {"domain/math/accuracy": math_acc[0], "domain/calc/accuracy": calc_acc[0]}
    (path / "summary.json").write_text(json.dumps({"steps": STEPS, "eval_before": before}))
    return path


def first_live_step(rows: list[dict], monitor: str) -> int | None:
    """The step at which the live health monitor `monitor` of `grpokit train` first warns on `rows` (its
    information that a run converged does not count)."""
    from grpokit.config.health import HealthConfig
    from grpokit.record.health import HealthMonitor

    hm = HealthMonitor(HealthConfig())
    for r in rows:
        events, _ = hm.observe({k: v for k, v in r.items() if k != "step"}, r["step"])
        if any(e.monitor == monitor and e.level == "warning" for e in events):  # not a "converged" note
            return r["step"]
    return None


def trainer_row(step: int, rewards_PG: list[list[float | None]], fn: str = "f", **over) -> dict:
    """One metrics.jsonl line as `grpokit train` writes it (the keys of a real line: rewards/runner.py's per
    function and per step, train/step_metrics.py's, record/signatures.py's) for one reward function `fn`
    whose values are `rewards_PG` (P groups of G; None: the function answered None, the completion unscored and
    counted 0 in the totals); `over` sets the update's metrics (grad_norm, kl, entropy ...)."""
    from grpokit.record.signatures import solved_signatures

    flat = [v for g in rewards_PG for v in g]
    scored = [v for v in flat if v is not None]
    totals_PG = [[0.0 if v is None else v for v in g] for g in rewards_PG]
    totals = [v for g in totals_PG for v in g]
    P, G, N = len(rewards_PG), len(rewards_PG[0]), len(flat)

    def pstd(xs: list[float]) -> float:
        m = sum(xs) / len(xs)
        return (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5

    flat_groups = sum(pstd(g) == 0.0 for g in totals_PG)
    counts = ("failures", "nonfinite", "zeroed", "timeouts", "tampering", "crashes", "limits", "machine_failures")
    row = {
        "step": step,
        f"rewards/{fn}/mean": sum(scored) / len(scored) if scored else "NaN",
        f"rewards/{fn}/std": pstd(scored) if scored else "NaN",
        **{f"rewards/{fn}/{c}": 0.0 for c in counts},
        f"rewards/{fn}/not_applicable": float(N - len(scored)),
        "rewards/failed_fraction": 0.0,
        "rewards/scored": float(N),
        "rewards/unscored": float(N - len(scored)),
        "reward": sum(totals) / N,
        "reward_std": sum(pstd(g) for g in totals_PG) / P,
        "frac_reward_zero_std": flat_groups / P,
        "num_zero_std_groups": float(flat_groups),
        "completions/mean_length": 5.0,
        "completions/max_length": 6.0,
        "completions/clipped_ratio": 0.0,
        "completions/frac_groups_same_length": 0.0,
        "completions/frac_groups_same_text": 0.0,
        **solved_signatures([f"t{i}" for i in range(N)], totals, G),
        "clip_ratio/region_mean": 0.0,
        "clip_ratio/low_mean": 0.0,
        "clip_ratio/high_mean": 0.0,
        "kl": 0.001,
        "loss": 0.0,
        "grad_norm": 0.05,
        "entropy": 0.4,
        "time/reward": 0.01,
        "time/step": 0.3,
    }
    return row | over
