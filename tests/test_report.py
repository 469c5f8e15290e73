"""The HTML report: every plot present, hostile samples escaped, no network references, renders."""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from grpokit.record import HealthConfig, make_recorder, sample_rows
from grpokit.record.report import PLOTS, render_report, report_main, write_report
from grpokit.record.svg import Series, format_tick, line_chart, moving_average, nice_ticks

HOSTILE = "<script>alert(1)</script>"


def make_run_dir(run_dir: Path, steps: int = 120) -> Path:
    """A synthetic run written through the real Recorder: a learning run whose entropy collapses late."""
    rng = random.Random(0)
    rec = make_recorder(run_dir, ["jsonl"], total_steps=steps, samples_every=40, samples_prompts=2,
                        health=HealthConfig(max_nonfinite_steps=5))
    for step in range(1, steps + 1):
        frac = step / steps
        m = {
            "reward": 0.2 + 0.9 * frac + rng.gauss(0, 0.08),
            "reward_std": 0.4 - 0.1 * frac,
            "rewards/math/mean": 0.1 + 0.7 * frac + rng.gauss(0, 0.08),
            "rewards/format/mean": 0.1 + 0.2 * min(1.0, 3 * frac) + rng.gauss(0, 0.03),
            "frac_reward_zero_std": 0.5 - 0.3 * frac + rng.gauss(0, 0.05),
            "completions/mean_length": 180 - 60 * frac + rng.gauss(0, 8),
            "completions/min_length": 40 + rng.gauss(0, 5),
            "completions/max_length": 256.0,
            "completions/clipped_ratio": max(0.0, 0.15 - 0.1 * frac + rng.gauss(0, 0.02)),
            "kl": 0.004 * step ** 0.8,
            "entropy": 0.8 * math.exp(-3 * frac) if step > 20 else 0.8,
            "clip_ratio/low_mean": 0.004 + rng.uniform(0, 0.002),
            "clip_ratio/high_mean": 0.01 + rng.uniform(0, 0.004),
            "clip_ratio/region_mean": 0.015 + rng.uniform(0, 0.005),
            "loss": math.nan if step == 77 else rng.gauss(0, 0.05),
            "grad_norm": abs(rng.gauss(1.0, 0.3)),
            "learning_rate": 1e-6,
            "time/rollout": 3.0 + rng.uniform(0, 0.5),
            "time/reward": 0.2 + rng.uniform(0, 0.05),
            "time/update": 1.5 + rng.uniform(0, 0.2),
            "time/step": 4.8,
            "tokens_per_second": 850 + rng.uniform(-50, 50),
        }
        if step % 20 == 0:
            m["eval/accuracy"] = 0.2 + 0.5 * frac
        rec.log(m, step)
        if rec.wants_samples(step):
            texts = ["Let me think. 2 + 3 = 5.\n\\boxed{5}", HOSTILE, "The answer is <b>6</b>", "\\boxed{5}"]
            rec.log_samples(step, sample_rows(
                prompts=["What is 2 + 3? Put the answer in \\boxed{}.", "Is 7 < 9 & 9 > 7?"],
                texts=texts, rewards_per_func={"math": [1, 0, 0, 1], "format": [1, 0, 0, 1]},
                rewards=[2, 0, 0, 2], advantages=[1.0, -1.0, -1.0, 1.0], lengths=[14, 9, 7, 5],
                finish_reasons=["stop", "stop", "length", "stop"], group_size=2))
    rec.close()
    (run_dir / "config.yaml").write_text("model: tiny-demo\nlearning_rate: 1.0e-06\nnote: \"<img src=x onerror=alert(2)>\"\n")
    (run_dir / "summary.json").write_text(json.dumps({"eval_before": {"accuracy": 0.18}, "eval_after": {"accuracy": 0.71}, "steps": steps}))
    return run_dir


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    return make_run_dir(tmp_path / "run")


def test_report_has_every_plot_and_sections(run_dir: Path) -> None:
    html = write_report(run_dir).read_text()
    for plot_id, *_ in PLOTS:
        block = re.search(rf'id="plot-{plot_id}".*?</div></div>|id="plot-{plot_id}".*?</svg>', html, re.S)
        assert block and "<svg" in block.group(0), f"plot {plot_id} missing or empty"
    for label in ("rewards/math/mean", "rewards/format/mean", "before / after training", "time/rollout"):
        assert label in html
    assert "0.18 → 0.71" in html  # eval accuracy before -> after
    assert "entropy_collapse" in html and "nonfinite" in html  # health warnings of this run
    assert "Sample completions" in html and "What is 2 + 3?" in html


def test_report_escapes_untrusted_text(run_dir: Path) -> None:
    html = render_report(run_dir)
    assert HOSTILE not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>6</b>" not in html and "&lt;b&gt;6&lt;/b&gt;" in html
    assert "<img" not in html  # from config.yaml
    assert "7 &lt; 9 &amp; 9 &gt; 7" in html
    assert "<script" not in html.lower()


def test_report_is_self_contained(run_dir: Path) -> None:
    html = render_report(run_dir)
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert not re.search(r"url\(|@import|<link|<iframe|<object|<embed", html, re.I)
    assert "http://" not in html and "https://" not in html


def test_missing_files_are_fine(tmp_path: Path) -> None:
    html = render_report(tmp_path)
    assert "No metrics.jsonl" in html and "No samples were logged" in html and "No config.yaml" in html
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": "NaN"}\n{"step": 3, "rew')
    html = render_report(tmp_path)
    assert 'id="plot-reward"' in html and "not recorded in this run" in html  # kl etc. absent
    (tmp_path / "summary.json").write_text("not json")
    assert "No summary.json" in render_report(tmp_path)


def test_report_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report_main(tmp_path / "nope") == 2
    assert "is not a directory" in capsys.readouterr().out
    assert report_main(tmp_path) == 0 and (tmp_path / "report.html").exists()


def test_svg_helpers_hand_worked() -> None:
    assert nice_ticks(0.03, 0.97) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]  # span 0.94 / 5 = 0.188 -> step 0.2
    assert nice_ticks(1, 200, 6) == [0, 50, 100, 150, 200]  # 199 / 6 = 33.2 -> step 50
    assert nice_ticks(0, 0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]  # all zero: open upwards, not to -1
    assert format_tick(0.25, 0.05) == "0.25" and format_tick(20000, 5000) == "20k" and format_tick(0.4, 0.2) == "0.4"
    # Centred, window 3: [mean(1,3), mean(1,3), nan, mean(5)] (non-finite neighbours are skipped).
    assert moving_average([1, 3, math.nan, 5], 3) == pytest.approx([2, 2, math.nan, 5], nan_ok=True)
    svg = line_chart([Series("a<b", [(1, 1.0), (2, math.nan), (3, 2.0)])])
    assert svg.count(" M") + svg.count('d="M') == 2  # the NaN lifts the pen: two sub-paths
    assert "a&lt;b" in svg and "a<b" not in svg


CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary installed")
@pytest.mark.timeout(120)
def test_report_renders_headless(run_dir: Path, tmp_path: Path) -> None:
    report = write_report(run_dir)
    png = tmp_path / "report.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
           f"--screenshot={png}", "--window-size=1200,2400", report.as_uri()]
    subprocess.run(cmd, check=True, timeout=100, capture_output=True)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # a blank page compresses to a few KB


def test_moving_average_equals_naive_and_long_runs_stay_small() -> None:
    rng = random.Random(1)
    values = [rng.random() if i % 7 else math.nan for i in range(300)]
    naive = []
    for i, v in enumerate(values):  # the definition: mean of finite values within window // 2 either side
        near = [u for u in values[max(0, i - 5): i + 6] if math.isfinite(u)]
        naive.append(v if not math.isfinite(v) else sum(near) / len(near))
    assert moving_average(values, 11) == pytest.approx(naive, nan_ok=True)
    svg = line_chart([Series("long", [(i, math.sin(i / 300)) for i in range(20_000)])], max_points=600)
    assert svg.count(" L") < 2 * 700 and len(svg) < 60_000  # two thinned lines of ~600 points each
