"""The HTML report's content: panels chosen from what was logged, hostile text escaped, no network,
comparison of runs, the live rewrite loop. tests/record/test_report_browser.py opens it in chromium."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.record import make_recorder
from grpokit.record.report import payload, render_report, report_main, watch, write_comparison
from grpokit.record.report_data import config_diff, load_run, panels, same_as
from helpers.paths import ROOT
from helpers.report_runs import HOSTILE, PNG, make_run_dir
from helpers.run_locks import dead_pid, write_lock


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    return make_run_dir(tmp_path / "run")


def _data(html: str) -> dict:
    return json.loads(
        re.search(r'<script type="application/json" id="grpokit-data">(.*?)</script>', html, re.S).group(1)
    )


def test_every_logged_metric_has_a_panel_and_none_is_empty(run_dir: Path) -> None:
    plots = {p["id"]: p["keys"] for p in panels([load_run(run_dir)])}
    assert plots["reward"] == [
        "reward",
        "rewards/math/mean",
        "rewards/format/mean",
    ]  # per-function curves with the total
    assert plots["eval"] == ["eval/accuracy"] and plots["kl"] == ["kl"]
    assert ["mytask/format_bonus"] in plots.values()  # log_metric: a panel of its namespace
    drawn = {k for keys in plots.values() for k in keys}
    assert "rewards/math/failures" not in drawn  # 0 at every step: listed, not drawn
    assert "0 at every step (not drawn): rewards/math/failures" in render_report(run_dir)
    # beta 0: no KL logged, so no KL panel (no empty "not recorded" card)
    no_kl = make_run_dir(run_dir.parent / "nokl", steps=30, beta=0.0)
    assert "kl" not in {p["id"] for p in panels([load_run(no_kl)])}


REWARD_MODULE = """
def bonus(completions, log_metric, log_extra, **kwargs):
    log_metric("mytask/chars", sum(len(c) for c in completions) / len(completions))
    log_extra("judge_note", ["short" if len(c) < 4 else "long" for c in completions])
    return [len(c) / 100 for c in completions]
"""


def test_a_real_runs_log_metric_and_log_extra_reach_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real `grpokit train` of the demo with a reward function that logs: its `log_metric` value gets a
    panel of its namespace, its curve sits with the task's on the reward panel, its `log_extra` column is
    beside each sampled completion."""
    (tmp_path / "logging_reward.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--out",
                str(run),
                "train.steps=2",
                "data.eval_size=8",
                "record.samples_every=1",
                "reward.functions=[task,logging_reward:bonus]",
            ]
        )
        == 0
    )
    data = _data((run / "report.html").read_text())
    plots = {p["id"]: p["keys"] for p in data["panels"]}
    assert plots["reward"] == ["reward", "rewards/arithmetic_accuracy/mean", "rewards/bonus/mean"]
    assert ["mytask/chars"] in plots.values() and len(data["runs"][0]["series"]["mytask/chars"]) == 2
    notes = {c["extra"]["judge_note"] for row in data["runs"][0]["samples"] for c in row["completions"]}
    assert notes and notes <= {"short", "long"}


def test_payload_steps_are_integers_and_nan_is_a_gap(run_dir: Path) -> None:
    run = _data(render_report(run_dir))["runs"][0]
    assert run["steps"] == list(range(1, 121)) and all(isinstance(s, int) for s in run["steps"])
    assert run["series"]["loss"][76] is None  # step 77's NaN loss: a gap, not a number JSON cannot hold
    assert run["series"]["eval/accuracy"][19] == pytest.approx(0.2 + 0.5 * 20 / 120, abs=1e-6)
    assert run["series"]["eval/accuracy"][18] is None
    assert run["heldout"] == [[0, 0.18], [120, 0.71]]  # summary.json: before (step 0) and after (last step)


def test_identical_series_are_marked_so_both_stay_visible(tmp_path: Path) -> None:
    rec = make_recorder(tmp_path, ["jsonl"], total_steps=3)
    for step, r in enumerate([0.1, 0.5, 0.9], 1):  # one reward function of weight 1: total == component
        rec.log({"reward": r, "rewards/only/mean": r, "rewards/other/mean": 1 - r}, step)
    rec.close()
    run = load_run(tmp_path)
    assert same_as([run], ["reward", "rewards/only/mean", "rewards/other/mean"]) == {"rewards/only/mean": "reward"}
    assert payload([run])["panels"][0]["same"] == {"rewards/only/mean": "reward"}


def test_report_escapes_untrusted_text(run_dir: Path) -> None:
    html = render_report(run_dir)
    assert HOSTILE not in html and "<b>6</b>" not in html and "<i>fine</i>" not in html
    assert "<img" not in html  # the config's hostile note is escaped in the config section
    assert "&lt;img src=x onerror=alert(2)&gt;" in html
    assert html.lower().count("<script") == 3  # data, uPlot, the page's script: nothing from the run
    data = _data(html)  # the JSON still holds the exact text, for textContent
    texts = [c["text"] for row in data["runs"][0]["samples"] for c in row["completions"]]
    assert HOSTILE in texts and "The answer is <b>6</b>" in texts


def test_report_is_self_contained(run_dir: Path) -> None:
    html = render_report(run_dir)
    assert "Content-Security-Policy" in html and "default-src 'none'" in html  # the browser refuses any request
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert not re.search(r"<link|<iframe|<object|<embed|@import", html, re.I)


def test_samples_keep_extras_turns_and_inline_only_the_runs_images(run_dir: Path) -> None:
    rows = _data(render_report(run_dir))["runs"][0]["samples"]
    first = rows[0]["completions"]
    assert first[0]["extra"] == {"judge_note": "<i>fine</i>", "score_raw": 0.75}
    assert first[0]["messages"][0]["tool_calls"][0]["function"]["name"] == "calc"
    # images/draw.png inlined; ../outside.png lies outside the run folder and is ignored
    assert first[1]["images"] == ["data:image/png;base64," + base64.b64encode(PNG).decode()]
    assert [r["step"] for r in rows] == [40, 40, 80, 80, 120, 120]
    assert rows[1]["completions"][0]["rewards"]["format"] == "NaN"  # strict JSON; shown as NaN


def test_missing_files_are_fine(tmp_path: Path) -> None:
    html = render_report(tmp_path)
    assert "No metrics.jsonl" in html and "No samples were logged" in html and "No config.yaml" in html
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "reward": 0.5}\n{"step": 2, "reward": "NaN"}\n{"step": 3, "rew'
    )
    data = _data(render_report(tmp_path))
    assert [p["id"] for p in data["panels"]] == ["reward"] and data["runs"][0]["series"]["reward"] == [0.5, None]
    (tmp_path / "summary.json").write_text('{"eval_before": {"accuracy": 0.25}, "eval_after": {"accuracy": 0.5}}')
    data = _data(render_report(tmp_path))  # no eval/* metric, but summary.json's accuracies make the panel
    assert [p["id"] for p in data["panels"]] == ["reward", "eval"] and data["runs"][0]["heldout"] == [
        [0, 0.25],
        [2, 0.5],
    ]
    (tmp_path / "summary.json").write_text("not json")
    assert "No summary.json" in render_report(tmp_path)


def test_report_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report_main(tmp_path / "nope") == 2
    assert "is not a directory" in capsys.readouterr().out
    assert report_main(tmp_path) == 0 and (tmp_path / "report.html").exists()


def test_comparison_overlays_runs_and_lists_config_differences(tmp_path: Path) -> None:
    a = make_run_dir(tmp_path / "a", steps=30, lr=1e-6)
    b = make_run_dir(tmp_path / "b", steps=40, lr=3e-6)
    # optim.lr differs; train.out differs too but every run has its own folder, so it is not listed
    assert config_diff([load_run(a), load_run(b)]) == [("optim.lr", ["1e-06", "3e-06"])]
    out = tmp_path / "cmp.html"
    assert main(["report", str(a), str(b), "--out", str(out)]) == 0
    html = out.read_text()
    data = _data(html)
    assert [r["name"] for r in data["runs"]] == ["a", "b"] and len(data["runs"][1]["steps"]) == 40
    assert "Config differences" in html and "<code>optim.lr</code>" in html
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_watch_rewrites_until_the_run_finishes(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", steps=12, finished=False)
    out = tmp_path / "live.html"
    sleeps: list[float] = []
    watch([run], out, interval_s=3, max_updates=2, sleep=sleeps.append)
    assert sleeps == [3] and _data(out.read_text())["live"] == {"refresh_s": 3}  # in progress: the page reloads
    # the trainer takes run.lock, then writes summary.json with the evaluation before training: in progress
    write_lock(run)  # held by this (live) process
    (run / "summary.json").write_text('{"eval_before": {"accuracy": 0.2}}')
    sleeps.clear()
    watch([run], out, interval_s=3, max_updates=2, sleep=sleeps.append)
    assert sleeps == [3] and _data(out.read_text())["live"] == {"refresh_s": 3} and "(in progress)" in out.read_text()
    (run / "summary.json").write_text('{"steps": 12}')
    sleeps.clear()
    watch([run], out, interval_s=3, sleep=sleeps.append)
    assert sleeps == [] and _data(out.read_text())["live"] is None  # finished: one last write, no reload


def test_watch_stops_on_a_run_whose_process_died(tmp_path: Path) -> None:
    """A run killed with SIGKILL leaves run.lock naming a pid that is gone and summary.json without "steps": it
    has ended (record/run_status.py), so `report --watch` writes it once more without the reload and stops,
    and the page says how it ended. Before, it read "in progress" and the watcher never stopped."""
    run = make_run_dir(tmp_path / "run", steps=12, finished=False)
    (run / "summary.json").write_text('{"eval_before": {"accuracy": 0.2}}')
    write_lock(run, pid=dead_pid())
    out, sleeps = tmp_path / "live.html", []
    watch([run], out, interval_s=3, max_updates=5, sleep=sleeps.append)
    html = out.read_text()
    assert sleeps == [] and _data(html)["live"] is None
    assert "12 (died without a record)" in html and "run_killed" in html  # the doctor's finding at the top
    # a run that stopped with an error has ended too (it was "in progress" forever as well)
    (run / "run.lock").unlink()
    (run / "summary.json").write_text('{"eval_before": {}, "failed": {"step": 12, "error": "RewardError: x"}}')
    watch([run], out, interval_s=3, max_updates=5, sleep=sleeps.append)
    assert sleeps == [] and "(stopped by an error)" in out.read_text()


def test_each_rewrite_judges_each_run_once_and_sends_the_page_only_what_it_reads(tmp_path: Path, monkeypatch) -> None:
    """The headline, the doctor (its notes and run_killed), the payload's live setting and watch's stop each
    asked run_status again (reading run.lock and summary.json each time: 6 looks a rewrite, which could
    disagree while the run ends); now `Run.status` is judged once per read. The payload's "state" and
    "finished" were read by no line of report.js: gone."""
    from grpokit.record import report_data

    calls = []
    real = report_data.run_status
    monkeypatch.setattr(report_data, "run_status", lambda *a: calls.append(a[0]) or real(*a))
    run = make_run_dir(tmp_path / "run", steps=12, finished=False)
    (run / "summary.json").write_text('{"eval_before": {"accuracy": 0.2}}')
    write_lock(run)  # this process: alive, in progress
    sleeps: list[float] = []
    html = watch([run], tmp_path / "live.html", interval_s=3, max_updates=3, sleep=sleeps.append).read_text()
    assert calls == [run] * 3 and sleeps == [3, 3]  # one verdict per rewrite
    assert set(_data(html)["runs"][0]) == {"name", "steps", "heldout", "series", "samples"}
    script = (Path(report_data.__file__).parent / "assets" / "report.js").read_text()
    assert re.findall(r"\b(?:run|r|DATA\.runs\[\w+\])\.(?:state|finished)\b", script) == []


def test_a_1000_step_report_stays_small(tmp_path: Path) -> None:
    """docs/MONITORING.md quotes the size: 1,000 steps x 24 metrics and 50 sampled steps."""
    run = make_run_dir(tmp_path / "long", steps=1000)
    size = len(write_comparison([run], tmp_path / "r.html").read_bytes())
    assert 150_000 < size < 1_000_000, size


def test_make_test_installs_chromium_before_the_tests() -> None:
    """CI on a fresh clone runs `make test`: its recipe must install chromium (the browser tests skip without it)."""
    root = ROOT
    make = (root / "Makefile").read_text()
    recipe = make.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert recipe.startswith(" setup-test") and "pytest" in recipe  # the set-up runs before the recipe
    assert "scripts/setup.sh test" in make.split("\nsetup-test:", 1)[1].split("\n\n", 1)[0]
    setup = (root / "scripts" / "setup.sh").read_text()
    assert setup.index('[ "$JOB" = train ] && exit 0') < setup.index("bash scripts/install_test_deps.sh")
    script = (root / "scripts" / "install_test_deps.sh").read_text()
    assert "apt-get install" in script and "chromium" in script


SLOW_REWARD = """import os, pathlib, time

DEADLINE = time.monotonic() + 120


def slow(completions, **kwargs):
    # a verifier that waits, once the run has logged a step, until the test has seen the watcher's live
    # page (120 s at most in all): the run is watched in progress however slowly the watcher starts
    logged, seen = pathlib.Path(os.environ["RUN_METRICS"]), pathlib.Path(os.environ["SEEN_LIVE"])
    while logged.exists() and not seen.exists() and time.monotonic() < DEADLINE:
        time.sleep(0.05)
    return [0.0] * len(completions)
"""
WATCHED_STEPS = 6


def test_watch_follows_a_real_run_until_it_ends(tmp_path: Path) -> None:
    """`grpokit report --watch` beside a real `grpokit train`: while the run goes, the page carries the
    reload and fewer steps than the end; once the run writes summary.json the watcher writes the whole
    run without the reload and exits on its own."""
    (tmp_path / "slow_reward.py").write_text(SLOW_REWARD)
    run, out, seen = tmp_path / "run", tmp_path / "live.html", tmp_path / "seen-live"
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p),
        "RUN_METRICS": str(run / "metrics.jsonl"),
        "SEEN_LIVE": str(seen),
    }
    grpokit = [sys.executable, "-m", "grpokit"]
    log = tmp_path / "train.log"  # a file, not a pipe: nobody reads a pipe while the run goes, and a full one blocks it
    with open(log, "w") as sink:
        train = subprocess.Popen(
            [
                *grpokit,
                "train",
                "--out",
                str(run),
                f"train.steps={WATCHED_STEPS}",
                "data.eval_size=8",
                "reward.functions=[task,slow_reward:slow]",
            ],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while not (run / "metrics.jsonl").exists():  # the watcher needs the run folder
            assert train.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        watcher = subprocess.Popen(
            [*grpokit, "report", "--watch", str(run), "--interval", "0.5", "--out", str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        live_steps: list[int] = []
        while train.poll() is None and time.monotonic() < deadline:
            if out.exists():
                data = _data(out.read_text())
                if data["live"] == {"refresh_s": 0.5}:
                    live_steps.append(len(data["runs"][0]["steps"]))
                    seen.touch()  # the run may go on to its end
            time.sleep(0.3)
        assert train.wait(timeout=60) == 0, log.read_text()
        assert watcher.wait(timeout=60) == 0, watcher.communicate()  # stops by itself once the run has ended
    finally:
        train.kill()
    assert live_steps and min(live_steps) < WATCHED_STEPS, live_steps  # seen in progress
    final = _data(out.read_text())
    assert final["live"] is None and final["runs"][0]["steps"] == list(range(1, WATCHED_STEPS + 1))


def test_a_resumed_run_reads_in_progress_until_it_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished run resumed for more steps is in progress again: its summary.json loses "steps" until
    the end, so `--watch` keeps following it. A reward function probes the file during every step."""
    run = tmp_path / "run"
    (tmp_path / "probe_reward.py").write_text(
        "import json, pathlib\n\ndef probe(completions, log_metric, **kwargs):\n"
        f"    p = pathlib.Path({str(run / 'summary.json')!r})\n"
        "    log_metric('probe/finished', float(p.exists() and 'steps' in json.loads(p.read_text())))\n"
        "    return [0.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    common = ["data.eval_size=4", "reward.functions=[task,probe_reward:probe]"]
    assert main(["train", "--out", str(run), "train.steps=2", *common]) == 0
    assert load_run(run).finished
    assert main(["train", "--resume", str(run), "train.steps=4"]) == 0
    probes = [(r["step"], r["probe/finished"]) for r in load_run(run).metrics]
    assert probes == [(1, 0.0), (2, 0.0), (3, 0.0), (4, 0.0)], probes  # never "finished" while a step ran
    assert json.loads((run / "summary.json").read_text())["steps"] == 4 and load_run(run).finished
