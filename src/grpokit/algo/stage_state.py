"""State a stage keeps between optimizer updates, behind one small interface.

Most stages are functions of the step's batch. Two keep state across updates: lambda-GRPO's
learnable lambda (lambda_grpo.py: a parameter with its own Adam, stepped on the update's gradient)
and adaptive entropy control (entropy_control.py: the bonus coefficient, moved after each update
toward a target entropy). The loop holds a list of such states and calls each at the same points,
without knowing which variant it is:

    before_update(inputs) -> inputs     before the update's slices are backpropagated
    after_update(metrics, dist) -> dict after the optimizer step: its own step, metrics to log
    state_dict() / load_state_dict(s)   saved in a checkpoint's extra state under ``key``

A new stateful variant implements these and joins ``stage_states`` below; the loop does not change.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .entropy_control import EntropyController
from .lambda_grpo import LearnableLambda


@runtime_checkable
class StageState(Protocol):
    key: str  # its name in a checkpoint's extra state
    required: bool  # a resume must find it (False: a checkpoint without it starts the state afresh)

    def before_update(self, inputs: Any) -> Any:
        """The update's inputs (``pipeline.UpdateInputs``) as this state changes them."""

    def after_update(self, metrics: dict[str, float], dist: Any) -> dict[str, float]:
        """The update was applied with ``metrics``; step the state; returns metrics to add."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def stage_states(algo: Any, betas: tuple[float, float]) -> list[StageState]:
    """The states ``algo`` (an ``AlgoConfig``) turns on, in the order the loop calls them: the entropy
    coefficient first (the update's metrics report it), then lambda (``betas``: the run's Adam betas)."""
    out: list[StageState] = []
    if algo.entropy_adaptive:
        out.append(EntropyController.from_algo(algo))
    if algo.aggregation == "lambda-grpo":  # lambda-GRPO: a learnable lambda with its own optimizer
        out.append(LearnableLambda(algo.lambda_init, algo.lambda_lr, algo.lambda_r, betas))
    return out
