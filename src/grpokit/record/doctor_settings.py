"""The doctor's thresholds from the command line (`--set NAME=VALUE`) and a YAML file (`--config`).

A name is a ``DoctorConfig`` field (``truncated_max``) or a ``HealthConfig`` one, written
``health.kl_max`` (or bare, since the two share no field name); the file has ``doctor:`` and
``health:`` sections (a grpokit run's config.yaml works: its ``health`` section applies). Health
thresholds given here override the run's own ``health`` section. An unknown name or a value of the
wrong type is refused in one sentence.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from grpokit.config.health import HealthConfig
from grpokit.config.sections import ConfigError

from .findings import DoctorConfig

DOCTOR = {f.name: f for f in dataclasses.fields(DoctorConfig)}
HEALTH = {f.name: f for f in dataclasses.fields(HealthConfig)}


def _value(name: str, raw: Any, default: Any) -> Any:
    """`raw` checked against the type of the field's default (YAML-parsed when a string)."""
    if isinstance(raw, str) and not isinstance(default, str):
        import yaml

        raw = yaml.safe_load(raw)
    if isinstance(default, bool) or not isinstance(default, (int, float, list, tuple)):
        ok = isinstance(raw, type(default))
    elif isinstance(default, (list, tuple)):
        ok, raw = isinstance(raw, (list, tuple)), type(default)(raw) if isinstance(raw, (list, tuple)) else raw
    else:
        ok = (
            isinstance(raw, (int, float))
            and not isinstance(raw, bool)
            and (isinstance(default, float) or isinstance(raw, int))
        )
        raw = float(raw) if ok and isinstance(default, float) else raw
    if not ok:
        raise ConfigError(
            f"doctor threshold {name}={raw!r} is not valid; give a {type(default).__name__} like {default!r}"
        )
    return raw


def _put(name: str, raw: Any, doctor: dict[str, Any], health: dict[str, Any]) -> None:
    bare = name.removeprefix("doctor.").removeprefix("health.")
    if name.startswith("health.") or (bare in HEALTH and not name.startswith("doctor.")):
        if bare not in HEALTH:
            raise ConfigError(f"unknown health threshold {name!r}; valid: {', '.join(sorted(HEALTH))}")
        health[bare] = _value(name, raw, getattr(HealthConfig(), bare))
    elif bare in DOCTOR:
        doctor[bare] = _value(name, raw, getattr(DoctorConfig(), bare))
    else:
        raise ConfigError(
            f"unknown doctor threshold {name!r}; valid: {', '.join(sorted(DOCTOR))}, "
            f"or health.<{', '.join(sorted(HEALTH))}>"
        )


def thresholds(config_file: str | None = None, sets: list[str] = ()) -> tuple[DoctorConfig, dict[str, Any]]:
    """(DoctorConfig, health overrides) from a YAML file and NAME=VALUE settings (these win)."""
    doctor: dict[str, Any] = {}
    health: dict[str, Any] = {}
    if config_file:
        import yaml

        try:
            data = yaml.safe_load(Path(config_file).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"--config {config_file!r} cannot be read as YAML ({e.__class__.__name__})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--config {config_file!r} is not a mapping; give `doctor:` and `health:` sections")
        for section in ("doctor", "health"):
            for k, v in (data.get(section) or {}).items():
                _put(f"{section}.{k}", v, doctor, health)
    for item in sets:
        name, eq, raw = item.partition("=")
        if not eq or not name.strip():
            raise ConfigError(f"--set {item!r} is not NAME=VALUE; e.g. --set truncated_max=0.3")
        _put(name.strip(), raw.strip(), doctor, health)
    try:
        HealthConfig(**health)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return DoctorConfig(**doctor), health
