"""The one-sentence ConfigError that validation gives for a config with some fields set."""

from __future__ import annotations

import pytest

from grpokit.config import Config, ConfigError
from grpokit.validation import validate


def optim_error(overrides: dict) -> str:
    """The message of validating a default Config whose optim section has ``overrides``."""
    cfg = Config()
    for name, value in overrides.items():
        setattr(cfg.optim, name, value)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    return str(e.value)


def section_error(**sections: dict) -> str:
    """The message of validating a default Config with fields of several sections set:
    ``section_error(rollout={"async_staleness": 1}, env={"tools": ["python"]})``."""
    cfg = Config()
    for section, fields in sections.items():
        for name, value in fields.items():
            setattr(getattr(cfg, section), name, value)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    return str(e.value)
