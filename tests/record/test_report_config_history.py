"""The report's comparison and the doctor's quoted values read a run's config as --resume does: config.yaml
with config_history.yaml applied, a changed value shown with the step it took effect; a torn history is
shown around, and said."""

from __future__ import annotations

from pathlib import Path

from grpokit.config.io import sealed
from grpokit.record.report import config_diff_html
from grpokit.record.report_data import config_diff, load_run
from grpokit.record.run_series import config_value

START = "rollout:\n  temperature: 1.0\ntrain:\n  steps: 2\n"
HISTORY = "- step: 2\n  changed:\n    rollout.temperature: {from: 1.0, to: 0.5}\n    train.steps: {from: 2, to: 3}\n"


def run(path: Path, config: str, history: str | None = None) -> Path:
    path.mkdir()
    (path / "config.yaml").write_text(sealed(config))
    if history is not None:
        (path / "config_history.yaml").write_text(history)
    return path


def test_a_resumed_runs_changes_are_compared_with_the_step_they_took_effect(tmp_path: Path) -> None:
    """Run a: temperature 1.0, 3 steps. Run b started with 2 steps at 1.0 and was resumed from its step-2
    checkpoint with temperature 0.5 and 3 steps: both hold from step 3. Before: no temperature difference and
    b's train.steps shown as 2."""
    a = run(tmp_path / "a", "rollout:\n  temperature: 1.0\ntrain:\n  steps: 3\n")
    b = run(tmp_path / "b", START, sealed(HISTORY))
    assert config_diff([load_run(a), load_run(b)]) == [
        ("rollout.temperature", ["1.0", "1.0, then 0.5 from step 3"]),
        ("train.steps", ["3", "2, then 3 from step 3"]),
    ]
    assert config_value(load_run(b), "rollout.temperature") == 0.5  # the doctor quotes the value in force now


def test_a_torn_history_is_shown_around_and_said(tmp_path: Path) -> None:
    """A history whose checksum does not match (a hand edit or a torn write): config.yaml as the run started is
    compared, and the report says why; an entry without its new value is left out, the others applied."""
    a = run(tmp_path / "a", START)
    b = run(tmp_path / "b", START, sealed(HISTORY).replace("0.5", "0.7"))
    runs = [load_run(a), load_run(b)]
    assert config_diff(runs) == []
    assert "b: config_history.yaml is torn or damaged" in config_diff_html(runs)
    c = run(tmp_path / "c", START, HISTORY.replace("{from: 2, to: 3}", "{from: 2}"))
    loaded = load_run(c)
    assert config_diff([load_run(a), loaded]) == [("rollout.temperature", ["1.0", "1.0, then 0.5 from step 3"])]
    assert loaded.config_note == "config_history.yaml has 1 torn entry, left out"
