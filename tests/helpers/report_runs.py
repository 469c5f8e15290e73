"""A synthetic run folder written through the real Recorder, for the report and doctor tests."""

import base64
import json
import math
import random
from pathlib import Path

from grpokit.record import HealthConfig, make_recorder, sample_rows

HOSTILE = "<script>alert(1)</script>"
# The smallest valid PNG (1x1, transparent): 8-byte signature, IHDR, IDAT, IEND.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def make_run_dir(run_dir: Path, steps: int = 120, lr: float = 1e-6, beta: float = 0.04, finished: bool = True) -> Path:
    """A synthetic run written through the real Recorder: a learning run whose entropy collapses late,
    with a reward function's `log_metric` value, `log_extra` columns, a conversation and an image."""
    rng = random.Random(0)
    rec = make_recorder(
        run_dir,
        ["jsonl"],
        total_steps=steps,
        samples_every=40,
        samples_prompts=2,
        health=HealthConfig(max_nonfinite_steps=5),
    )
    for step in range(1, steps + 1):
        frac = step / steps
        m = {
            "reward": 0.2 + 0.9 * frac + rng.gauss(0, 0.08),
            "rewards/math/mean": 0.1 + 0.7 * frac + rng.gauss(0, 0.08),
            "rewards/format/mean": 0.1 + 0.2 * min(1.0, 3 * frac) + rng.gauss(0, 0.03),
            "rewards/math/failures": 0.0,
            "frac_reward_zero_std": 0.5 - 0.3 * frac + rng.gauss(0, 0.05),
            "completions/mean_length": 180 - 60 * frac + rng.gauss(0, 8),
            "completions/max_length": 256.0,
            "entropy": 0.8 * math.exp(-3 * frac) if step > 20 else 0.8,
            "loss": math.nan if step == 77 else rng.gauss(0, 0.05),
            "grad_norm": abs(rng.gauss(1.0, 0.3)),
            "time/rollout": 3.0 + rng.uniform(0, 0.5),
            "time/step": 4.8,
            "mytask/format_bonus": 0.5 * frac,  # a reward function's log_metric
        }
        if beta:
            m["kl"] = 0.004 * step**0.8
        if step % 20 == 0:
            m["eval/accuracy"] = 0.2 + 0.5 * frac
        rec.log(m, step)
        if rec.wants_samples(step):
            rows = sample_rows(
                prompts=["What is 2 + 3? Put the answer in \\boxed{}.", "Is 7 < 9 & 9 > 7?"],
                texts=["Let me think. 2 + 3 = 5.\n\\boxed{5}", HOSTILE, "The answer is <b>6</b>", "\\boxed{5}"],
                rewards_per_func={"math": [1, 0, 0, 1], "format": [1, 0, 0, 1]},
                rewards=[2, 0, 0, 2],
                advantages=[1.0, -1.0, -1.0, 1.0],
                lengths=[14, 9, 7, 5],
                finish_reasons=["stop", "stop", "length", "stop"],
                group_size=2,
                messages=[
                    [
                        {
                            "role": "assistant",
                            "content": "t",
                            "tool_calls": [{"function": {"name": "calc", "arguments": {"expr": "2+3"}}}],
                        },
                        {"role": "tool", "name": "calc", "content": "5"},
                    ],
                    [],
                    [],
                    [],
                ],
            )
            rows[0]["completions"][0]["extra"] = {"judge_note": "<i>fine</i>", "score_raw": 0.75}
            rows[0]["completions"][1]["images"] = ["draw.png", "../outside.png"]
            rows[1]["completions"][0]["rewards"]["format"] = math.nan  # a reward that failed or did not apply
            rec.log_samples(step, rows)
    rec.close()
    (run_dir / "images").mkdir(exist_ok=True)
    (run_dir / "images" / "draw.png").write_bytes(PNG)
    (run_dir.parent / "outside.png").write_bytes(PNG)
    (run_dir / "config.yaml").write_text(
        f"model:\n  name_or_path: tiny-demo\noptim:\n  lr: {lr:.1e}\nalgo:\n  beta: {beta}\n"
        f'train:\n  out: {run_dir}\nnote: "<img src=x onerror=alert(2)>"\n'
    )
    if finished:
        (run_dir / "summary.json").write_text(
            json.dumps({"eval_before": {"accuracy": 0.18}, "eval_after": {"accuracy": 0.71}, "steps": steps})
        )
    return run_dir
