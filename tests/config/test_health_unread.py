"""health.* with the monitors off (health.enabled=false): the thresholds the doctor reads (report.html at the end,
``grpokit doctor``: the run's health section) still act and are accepted; the two only the live monitors read,
config/health.py LIVE_ONLY, are refused in one sentence, as other settings nothing reads are (before, both were
accepted and never read)."""

import dataclasses
import re
from pathlib import Path

import pytest

from grpokit.config import Config, ConfigError, apply_overrides
from grpokit.config.health import LIVE_ONLY, HealthConfig
from grpokit.validation import validate

SRC = Path(__file__).resolve().parents[2] / "src" / "grpokit"


@pytest.mark.parametrize("setting, default", [("health.repeat_every=5", 50), ("health.doctor_every=0", 10)])
def test_a_live_monitor_setting_with_the_monitors_off_is_refused(setting, default):
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), ["health.enabled=false", setting]))
    assert str(e.value) == (
        f"{setting} has no effect with health.enabled=false (only the live monitors read it, not the doctor); set "
        f"health.enabled=true, or leave it {default}"
    )
    validate(apply_overrides(Config(), [setting]))  # the monitors on: read


def test_a_threshold_the_doctor_reads_is_accepted_with_the_monitors_off():
    over = ["health.enabled=false", "health.kl_max=2", "health.window=4", "health.same_length_min_tokens=8"]
    validate(apply_overrides(Config(), over))


def test_live_only_is_what_no_doctor_check_or_step_metric_reads():
    """A health field is live-only exactly when no module but the live monitor's (record/health.py) and the
    recorder that starts it reads it (as an attribute, or by name: ``_above``'s getattr): the doctor's checks
    (the rest of record/, health_checks.py's monitors included, which run_series replays) and the trainer's step
    metrics (train/, trl/) read the others."""
    readers = [
        p
        for p in [*SRC.glob("record/*.py"), *SRC.glob("train/*.py"), *SRC.glob("trl/**/*.py")]
        if p.name not in ("health.py", "recorder.py")
    ]
    text = "\n".join(p.read_text() for p in readers)
    names = [f.name for f in dataclasses.fields(HealthConfig) if f.name != "enabled"]
    unread_elsewhere = {n for n in names if not re.search(rf"\.{n}\b|[\"']{n}[\"']", text)}
    assert unread_elsewhere == set(LIVE_ONLY)
