"""Stage 0, configuration: typed sections (``sections.py``), building a config from YAML, dicts and
dotted overrides (``io.py``) and the published recipes (``presets/``). ``grpokit.config`` exports every
public name of the first two, as it always has. Checking a config as a whole reads the registries of the
packages that import this one, so it lives above them, in ``grpokit.validation`` (``validate``).
Modules inside grpokit import from the defining module, never from this package, so that no import
circle runs through it.
"""

from grpokit.config.health import HealthConfig
from grpokit.config.io import (
    apply_overrides,
    assigned,
    describe_fields,
    field_docs,
    from_dict,
    load_yaml,
    save_yaml,
    set_field,
    to_dict,
)
from grpokit.config.sections import (
    AlgoConfig,
    Config,
    ConfigError,
    DataConfig,
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RecordConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
    section,
)

__all__ = [
    "AlgoConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EnvConfig",
    "HealthConfig",
    "ModelConfig",
    "OptimConfig",
    "RecordConfig",
    "RewardConfig",
    "RolloutConfig",
    "TrainConfig",
    "apply_overrides",
    "assigned",
    "describe_fields",
    "field_docs",
    "from_dict",
    "load_yaml",
    "save_yaml",
    "section",
    "set_field",
    "to_dict",
]
