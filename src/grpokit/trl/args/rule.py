"""One row of the TRL mapping (grpokit/trl/mapping.py) and what the group modules share.

A ``Rule`` names TRL arguments, the grpokit fields they set and how (the text docs/TRL.md shows), and
``apply(args, ctx)`` returns the fields' values; ``ctx`` holds ``num_rows``, ``world_size``,
``streamed`` and ``steps``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from grpokit.config.sections import ConfigError

# The GRPOConfig a rule or a check reads. config.py runs the checks the group modules hold, so they name
# its type by this alias instead of importing config.py (which would close an import circle).
TrlArgs = Any


@dataclass(frozen=True)
class Rule:
    """One row of the mapping: TRL arguments -> grpokit fields, and how."""

    args: tuple[str, ...]
    fields: tuple[str, ...]
    how: str
    apply: Callable[[TrlArgs, dict], dict[str, Any]]


def refuse(name: str, value: Any, valid: str) -> ConfigError:
    """The one-sentence error of a TRL argument value grpokit cannot carry out."""
    return ConfigError(f"GRPOConfig argument {name}={value!r} is not supported by grpokit; valid: {valid}")


def copied(**pairs: str) -> Callable[[TrlArgs, dict], dict[str, Any]]:
    """A plain copy: grpokit field <- TRL argument."""
    return lambda a, ctx: {f: getattr(a, n) for f, n in pairs.items()}


def every_steps(value: float | None, steps: int, state: bool = False) -> int:
    """A step count, or a fraction of the run's steps (transformers' convention for values below 1; None:
    transformers' default, 500); a negative value gives its period's size (``negative_period``). With ``state``,
    logging_steps / eval_steps as transformers' TrainerState holds them: a negative period keeps its sign
    (``step % period == 0`` reads it the same) and 0 is 1 (every step). Examples on a 10-step run: 0.25 ->
    ceil(2.5) = 3; 4 -> 4; -0.25 -> ceil(-2.5) = -2, its size 2, with state -2; 0 -> 0, with state 1."""
    value = 500 if value is None else value
    if value < 0:
        period = negative_period(value, steps)
        return period if state else -period
    every = max(1, math.ceil(value * steps)) if 0 < value < 1 else int(value)
    return max(1, every) if state else every


def negative_period(value: float, steps: int) -> int:
    """transformers' period of a negative step setting (below 1, so ``ceil(steps * value)``, negative: a
    step logs when the step count is a multiple of it); refused where that is 0, on which transformers fails."""
    every = math.ceil(value * steps)
    if every == 0:
        raise ConfigError(
            f"GRPOConfig step setting {value} on a {steps}-step run gives transformers' period ceil({steps} * {value}) "
            "= 0, on which TRL fails (modulo by zero); use a number > 0"
        )
    return every
