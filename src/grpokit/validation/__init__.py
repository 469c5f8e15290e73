"""Validation of a whole config before any work starts.

``validate`` checks every value that can be checked without loading anything and raises
``ConfigError`` with one sentence naming the field, the value and what would be valid. Checks that
need data (a missing column) happen where the data is loaded, still before the first step.
"""

from __future__ import annotations

from grpokit.config.sections import Config

from .algo import check_algo_limits, check_algo_objective, check_sampling_and_shaping, check_unread_algo, unread_rules
from .model import check_model, check_record_data
from .rollout import check_rollout
from .train import check_optim_train, check_reward_env

__all__ = ["unread_rules", "validate"]


def validate(cfg: Config) -> Config:
    """Check every value that can be checked without loading anything; raise ``ConfigError``.
    The sections are checked in a fixed order; the first wrong value found is the one reported."""
    for check in (
        check_model,
        check_rollout,
        check_algo_objective,
        check_sampling_and_shaping,
        check_algo_limits,
        check_unread_algo,
        check_optim_train,
        check_reward_env,
        check_record_data,
    ):
        check(cfg)
    return cfg
