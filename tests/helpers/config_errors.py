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
