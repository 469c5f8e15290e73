"""Recorder, JSONL files, console sink and resume truncation."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from grpokit.record import HealthConfig, NullRecorder, TrainingHealthError, make_recorder, sample_rows
from grpokit.record.console import ConsoleSink, format_duration, format_value, key_figures_line
from grpokit.record.jsonl import read_jsonl, to_json_value, truncate_jsonl


def _metrics(step: int) -> dict[str, float]:
    return {"reward": 0.1 * step, "kl": 0.001 * step, "loss": 1.0 / step, "grad_norm": 0.5}


def test_null_recorder_accepts_everything() -> None:
    with NullRecorder() as rec:
        rec.log({"reward": 1.0}, step=1)
        rec.log_samples(1, [{"prompt": "p", "completions": []}])
        rec.warn(1, "hello")
        assert rec.wants_samples(10) is False


def test_jsonl_one_line_per_step_with_step(tmp_path: Path) -> None:
    rec = make_recorder(tmp_path, ["jsonl"], total_steps=3)
    for step in (1, 2, 3):
        rec.log(_metrics(step), step)
        # Flushed at once: the line is readable while the run is still going (a killed run keeps it).
        assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == step
    rec.close()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["reward"] == pytest.approx(0.2)


def test_nonfinite_values_keep_file_strict_json(tmp_path: Path) -> None:
    rec = make_recorder(tmp_path, [], total_steps=2)
    rec.log({"loss": math.nan, "grad_norm": math.inf, "kl": -math.inf, "reward": 1.0}, step=1)
    rec.close()
    line = (tmp_path / "metrics.jsonl").read_text().strip()
    # Python's strict parser must accept it: no bare NaN/Infinity tokens.
    obj = json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    assert obj["loss"] == "NaN" and obj["grad_norm"] == "Infinity" and obj["kl"] == "-Infinity"
    back = read_jsonl(tmp_path / "metrics.jsonl")[0]
    assert math.isnan(back["loss"]) and back["grad_norm"] == math.inf and back["kl"] == -math.inf


def test_to_json_value_converts_tensors() -> None:
    torch = pytest.importorskip("torch")
    assert to_json_value(torch.tensor(2.5)) == 2.5
    assert to_json_value({"a": torch.tensor(float("nan"))}) == {"a": "NaN"}
    assert to_json_value([1, 2.0, True]) == [1, 2.0, True]


def test_resume_truncates_later_steps(tmp_path: Path) -> None:
    # Uninterrupted run: steps 1..6.
    full = tmp_path / "full"
    rec = make_recorder(full, [], total_steps=6, health=HealthConfig(enabled=False))
    for step in range(1, 7):
        rec.log(_metrics(step), step)
    rec.close()
    # Interrupted run: wrote 1..5, crashed mid-line, resumes from the checkpoint of step 3.
    broken = tmp_path / "broken"
    rec = make_recorder(broken, [], total_steps=6, health=HealthConfig(enabled=False))
    for step in range(1, 6):
        rec.log(_metrics(step), step)
    rec.close()
    with (broken / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "rew')  # torn line
    rec = make_recorder(broken, [], total_steps=6, resume_step=3, health=HealthConfig(enabled=False))
    for step in range(4, 7):
        rec.log(_metrics(step), step)
    rec.close()
    assert (broken / "metrics.jsonl").read_text() == (full / "metrics.jsonl").read_text()


def test_resumed_health_equals_an_unbroken_runs(tmp_path: Path) -> None:
    """The monitors' windows and already-given warnings survive a resume: no health/* value goes
    missing while they refill, and no warning is given twice."""
    health = HealthConfig(warmup_steps=2, window=2, repeat_every=50)

    def metrics(step: int) -> dict:
        # kl 2.0 > kl_max 1.0 from step 1: kl_runaway fires from step 2 (warmup 2) and warns once;
        # entropy 1.0 then 0.01 from step 5: the mean of the last 2 is < 0.05 from step 6 (collapse)
        return {"reward": 0.5, "kl": 2.0, "entropy": 1.0 if step < 5 else 0.01}

    full = tmp_path / "full"
    rec = make_recorder(full, [], total_steps=8, health=health)
    for step in range(1, 9):
        rec.log(metrics(step), step)
    rec.close()
    killed = tmp_path / "killed"
    rec = make_recorder(killed, [], total_steps=8, health=health)
    for step in range(1, 6):  # killed after step 5; its last checkpoint is step 3's
        rec.log(metrics(step), step)
    rec.close()
    rec = make_recorder(killed, [], total_steps=8, health=health, resume_step=3)
    for step in range(4, 9):
        rec.log(metrics(step), step)
    rec.close()
    events = read_jsonl(full / "health.jsonl")
    assert [(e["step"], e["monitor"]) for e in events] == [(2, "kl_runaway"), (6, "entropy_collapse")]
    assert read_jsonl(full / "metrics.jsonl")[3]["health/kl_runaway"] == 1.0  # step 4, right after the resume point
    assert (killed / "metrics.jsonl").read_text() == (full / "metrics.jsonl").read_text()
    assert (killed / "health.jsonl").read_text() == (full / "health.jsonl").read_text()


def test_truncate_jsonl_counts_dropped(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\n{"step": 2}\n{"note": "no step"}\n{"step": 3}\n')
    assert truncate_jsonl(p, 1) == 2  # steps 2 and 3 go, the step-less line stays
    assert [json.loads(x) for x in p.read_text().splitlines()] == [{"step": 1}, {"note": "no step"}]
    assert truncate_jsonl(tmp_path / "missing.jsonl", 1) == 0


def test_amend_adds_late_metrics_to_their_steps_row_once(tmp_path: Path) -> None:
    """An evaluation a stop cut, made up at --resume: its eval/* join the row of its step (as an uninterrupted
    run writes them), in the file the next lines append to; the health monitors do not see the step again."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.25}\n')
    rec = make_recorder(tmp_path, ["jsonl"], total_steps=3, resume_step=2)
    rec.amend({"eval/accuracy": 0.75, "eval/n": 4.0}, 2)
    rec.log({"reward": 1.0}, 3)  # the next step goes on after the amended row
    rec.close()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 1, "reward": 0.5},
        {"step": 2, "reward": 0.25, "eval/accuracy": 0.75, "eval/n": 4.0},
        {"step": 3, "reward": 1.0},
    ]


def test_fresh_run_replaces_old_files(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 99}\n')
    (tmp_path / "samples.jsonl").write_text('{"step": 99}\n')
    rec = make_recorder(tmp_path, [], total_steps=1)
    rec.log({"reward": 1.0}, 1)
    rec.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]
    assert not (tmp_path / "samples.jsonl").exists()


def test_samples_rows_and_schedule(tmp_path: Path) -> None:
    rows = sample_rows(
        prompts=["1+1?", "2+2?", "3+3?"],
        texts=["2", "3", "4", "4", "6", "<script>"],
        rewards_per_func={"math": [1, 0, 1, 1, 1, 0], "format": [0.5] * 6},
        rewards=[1.5, 0.5, 1.5, 1.5, 1.5, 0.5],
        advantages=[1.0, -1.0, 0.0, 0.0, 1.0, -1.0],
        lengths=[1, 1, 1, 1, 1, 8],
        finish_reasons=["stop"] * 5 + ["length"],
        group_size=2,
        max_prompts=2,
    )
    assert len(rows) == 2 and rows[0]["prompt"] == "1+1?"
    assert rows[0]["completions"][1] == {
        "text": "3",
        "rewards": {"math": 0.0, "format": 0.5},
        "reward": 0.5,
        "advantage": -1.0,
        "length": 1,
        "finish_reason": "stop",
    }
    rec = make_recorder(tmp_path, [], total_steps=20, samples_every=10, samples_prompts=1)
    assert rec.wants_samples(10) and not rec.wants_samples(11)
    rec.log_samples(5, rows)  # not a sample step: ignored
    rec.log_samples(10, rows)  # kept, trimmed to 1 prompt
    rec.close()
    saved = read_jsonl(tmp_path / "samples.jsonl")
    assert len(saved) == 1 and saved[0]["step"] == 10 and saved[0]["completions"][0]["text"] == "2"


def test_a_completion_whose_prompt_differs_from_its_rows_keeps_its_own() -> None:
    # an environment's random reset: completion 1 started from "play B", its row shows completion 0's "play A"
    rows = sample_rows(
        ["play A"], ["x", "y"], {}, [0, 0], [0, 0], [1, 1], ["stop"] * 2, 2, completion_prompts=["play A", "play B"]
    )
    assert rows[0]["prompt"] == "play A" and "prompt" not in rows[0]["completions"][0]
    assert rows[0]["completions"][1]["prompt"] == "play B"


def test_sample_rows_checks_lengths() -> None:
    with pytest.raises(ValueError, match="advantages has 1 entries, expected 2"):
        sample_rows(["p"], ["a", "b"], {}, [1, 2], [1], [1, 1], ["stop", "stop"], group_size=2)


def test_warn_goes_to_health_jsonl(tmp_path: Path) -> None:
    rec = make_recorder(tmp_path, [], total_steps=1)
    rec.warn(4, "reward function 'code' failed on 3 completions")
    rec.close()
    (event,) = read_jsonl(tmp_path / "health.jsonl")
    assert event["step"] == 4 and event["monitor"] == "note" and "code" in event["message"]


def test_unknown_sink_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown recorder sink\(s\) \['tensorbord'\]"):
        make_recorder(tmp_path, ["tensorbord"], total_steps=1)


def test_recorder_stops_after_k_nonfinite_steps_but_writes_them(tmp_path: Path) -> None:
    rec = make_recorder(tmp_path, [], total_steps=10, health=HealthConfig(max_nonfinite_steps=2))
    rec.log({"loss": 1.0, "grad_norm": 1.0}, 1)
    rec.log({"loss": math.nan, "grad_norm": 1.0}, 2)  # first NaN: warn, continue
    with pytest.raises(TrainingHealthError, match="2 steps in a row"):
        rec.log({"loss": math.nan, "grad_norm": math.nan}, 3)
    rec.close()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]  # the fatal step is on disk before the error
    assert rows[2]["health/nonfinite"] == 1.0
    assert [e["monitor"] for e in read_jsonl(tmp_path / "health.jsonl")] == ["nonfinite", "nonfinite"]


def test_console_plain_mode_prints_every_n_steps() -> None:
    out = io.StringIO()
    sink = ConsoleSink(total_steps=20, every=5, stream=out, live=False)
    for step in range(1, 21):
        sink.log({"reward": 0.5, "kl": 0.01, "time/step": 2.0}, step)
    sink.log({"eval/accuracy": 0.75}, 20)
    sink.warn(7, "watch out")
    sink.close()
    lines = out.getvalue().splitlines()
    assert [ln.split(" ")[1] for ln in lines[:4]] == ["5/20", "10/20", "15/20", "20/20"]
    assert "reward 0.5 | kl 0.01" in lines[0] and "2 s/step" in lines[0] and "eta" in lines[0]
    assert "eval_acc 0.75" in lines[4]
    assert lines[5] == "WARNING step 7 health/warning: watch out"
    assert "\x1b[" not in out.getvalue()  # no terminal control codes in a log file


def test_console_live_mode_runs() -> None:
    out = io.StringIO()
    sink = ConsoleSink(total_steps=3, stream=out, live=True)
    for step in (1, 2, 3):
        sink.log({"reward": 0.25 * step, "entropy": 0.7}, step)
    sink.warn(2, "[bold]markup in a message[/bold] is shown literally")
    sink.close()
    text = out.getvalue()
    assert "3/3" in text and "reward 0.75" in text and "[bold]markup" in text


def test_formatting_helpers() -> None:
    assert format_value(0.41234) == "0.412"
    assert format_value(0.00012) == "1.20e-04"
    assert format_value(1234.0) == "1234"
    assert format_value(math.nan) == "nan"
    assert format_duration(9.54) == "9.5s"
    assert format_duration(342) == "5m42s"  # 5*60 + 42
    assert format_duration(3725) == "1h02m"  # 3600 + 2*60 + 5
    assert key_figures_line({"kl": 0.5, "reward": 1.0, "unknown": 3.0}) == "reward 1 | kl 0.5"


def test_console_sink_from_factory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = make_recorder(tmp_path, ["console", "jsonl"], total_steps=2, console_every=1)
    rec.log({"reward": 1.0}, 1)
    rec.close()
    assert "step 1/2" in capsys.readouterr().out  # pytest's captured stdout is not a terminal


def test_public_api_signatures() -> None:
    """Freeze what the trainer and CLI call; change these only together with their callers."""
    import inspect

    from grpokit.record import Recorder
    from grpokit.record.health import group_signatures
    from grpokit.record.report import report_main, write_report

    assert str(inspect.signature(make_recorder)) == (
        "(run_dir: 'Path | None', sinks: 'list[str]', total_steps: 'int', config: 'Mapping[str, Any] | None' = None, "
        "*, health: 'HealthConfig | None' = None, resume_step: 'int | None' = None, samples_every: 'int' = 10, "
        "samples_prompts: 'int' = 4, console_every: 'int' = 10, project: 'str | None' = None, "
        "run_name: 'str | None' = None) -> 'Recorder'"
    )
    assert list(inspect.signature(Recorder.log).parameters) == ["self", "metrics", "step"]
    assert list(inspect.signature(Recorder.log_samples).parameters) == ["self", "step", "rows"]
    assert list(inspect.signature(Recorder.warn).parameters) == ["self", "step", "event"]
    assert list(inspect.signature(group_signatures).parameters) == [
        "texts",
        "lengths",
        "group_size",
        "finish_reasons",
        "min_length",
    ]
    assert list(inspect.signature(write_report).parameters) == ["run_dir"]
    assert list(inspect.signature(report_main).parameters) == ["run_dir"]


def test_failing_tracker_is_dropped_not_fatal(tmp_path: Path) -> None:
    class Broken:
        name = "broken"

        def log(self, metrics: object, step: int) -> None:
            raise ConnectionError("no network")  # noqa: E704

        def log_samples(self, step: int, rows: object) -> None:
            pass  # noqa: E704

        def warn(self, step: int, event: object) -> None:
            pass  # noqa: E704

        def close(self) -> None:
            pass  # noqa: E704

    rec = make_recorder(tmp_path, [], total_steps=3)
    rec.sinks.append(Broken())
    rec.log({"reward": 1.0}, 1)
    rec.log({"reward": 2.0}, 2)
    rec.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]
    (event,) = read_jsonl(tmp_path / "health.jsonl")
    assert event["monitor"] == "sink" and "broken sink failed in log (ConnectionError: no network)" in event["message"]
