"""``reward_funcs`` and ``reward_weights``: one object each, which the reward stage reads at every batch, as TRL's.

TRL's ``_calculate_rewards`` walks ``self.reward_funcs`` and weights the columns by ``self.reward_weights`` at
every generation batch, so a script that replaces a function (``trainer.reward_funcs[0] = fn``) or moves a
weight in place (``trainer.reward_weights[0] = 3.0``, a curriculum) changes the next batch's rewards. Here the
list and the tensor are held by the trainer and ``HeldRewards`` (the reward stage's slot, inside a subclass's
``_calculate_rewards`` adapter when there is one) brings the runner's functions and weights in line with them
before each batch is scored, training and evaluation alike. The functions keep the names they were built
with once training started (TRL keeps ``reward_func_names``); before ``train()`` an assignment rebuilds the
run from the new functions (assignable.py), names included. A list of another length is refused in one
sentence (one weight per function), as is a weight that is not a finite number.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from grpokit.config.sections import ConfigError

from . import assignable
from .held import HeldList


def init(facade: Any, funcs: list) -> None:
    """The held list of reward functions, and the weights tensor (TRL's: reward_weights, or 1.0 each) made
    anew only when the GRPOConfig's weights changed (a tensor changed in place is kept)."""
    v = vars(facade)
    if not isinstance(v.get("_reward_funcs"), HeldList):
        v["_reward_funcs"] = HeldList(funcs, lambda new: setattr(facade, "reward_funcs", new))
    weights = list(facade.cfg.reward.weights or [1.0] * len(funcs))
    if v.get("_weights_from") != weights:
        v["_reward_weights"], v["_weights_from"] = torch.tensor(weights, dtype=torch.float32), weights


def _set_funcs(self: Any, value: Any) -> None:
    """TRL's ``trainer.reward_funcs = [...]`` (or one slot of it): as many functions, converted as the
    constructor's (a string is a reward model); before train() the run is built anew from them (names
    included), during training the reward stage calls them from the next batch on."""
    from ..inputs import reward_funcs_of
    from .surface import reward_names

    value = list(value) if isinstance(value, list) else [value]
    held = self._reward_funcs
    classes = self._reward_classes if len(value) == len(held) else None
    funcs = reward_funcs_of(
        value, classes, chat_template_kwargs=self.args.chat_template_kwargs, device_of=lambda: self.accelerator.device
    )
    if len(funcs) != len(held):
        raise ConfigError(
            f"GRPOTrainer.reward_funcs can be replaced by as many functions ({len(held)}, one per reward "
            f"weight); got {len(funcs)}"
        )
    if not self._started:
        assignable.assign(self, "reward_funcs", held)  # a built, untrained run is built anew
        self._reward_func_names.replace_all(reward_names(funcs))
    held.replace_all(funcs)  # the list grpokit's run is built from, and HeldRewards reads at every batch


REWARD_FUNCS = property(
    lambda self: self._reward_funcs,
    _set_funcs,
    doc="TRL's: the reward functions (a string given is a reward model), in the order of the rewards' columns; "
    "replaced whole or one slot at a time, the reward stage calls the new ones from the next batch.",
)


def _checked_weights(facade: Any, value: Any) -> torch.Tensor:
    """``value`` as TRL's weights tensor: one finite number per reward function, or one sentence."""
    n = len(facade._reward_funcs)
    tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float32)
    values = tensor.detach().flatten().tolist() if tensor.dim() == 1 else None
    if values is None or len(values) != n or not all(math.isfinite(float(w)) for w in values):
        shown = values if values is not None else f"a tensor of shape {tuple(tensor.shape)}"
        raise ConfigError(
            f"GRPOTrainer.reward_weights must hold one finite number per reward function ({n}); it holds {shown}"
        )
    return tensor


def _set_weights(self: Any, value: Any) -> None:
    vars(self)["_reward_weights"] = _checked_weights(self, value)


REWARD_WEIGHTS = property(
    lambda self: self._reward_weights,
    _set_weights,
    doc="TRL's tensor of one weight per reward function (1.0 each when reward_weights is None); the reward stage "
    "reads it at every batch, so a change in place or a new tensor weights the next batch's rewards.",
)


class HeldRewards:
    """The reward stage's slot: the run's RewardRunner, its functions and weights brought in line with the
    trainer's ``reward_funcs`` and ``reward_weights`` before each batch is scored (``score``) and whenever its
    ``specs`` are read (a subclass's ``_calculate_rewards`` adapter weights the columns by them). Everything
    else is the runner's."""

    def __init__(self, facade: Any, trainer: Any, runner: Any):
        object.__setattr__(self, "facade", facade)
        object.__setattr__(self, "trainer", trainer)
        object.__setattr__(self, "runner", runner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.runner, name, value)

    @property
    def specs(self) -> list:
        self.sync()
        return self.runner.specs

    def score(self, *args: Any, **kwargs: Any) -> Any:
        self.sync()
        return self.runner.score(*args, **kwargs)

    def sync(self) -> None:
        """The runner's functions and weights become the held list's and tensor's (those that differ)."""
        f, runner = self.facade, self.runner
        for i, fn in enumerate(list(f._reward_funcs)[: len(runner.specs)]):
            if runner.specs[i].fn is not fn:
                runner.set_function(i, fn)
        held = _checked_weights(f, f._reward_weights).detach().float().cpu().flatten()
        specs = runner.specs
        built = torch.tensor([s.weight for s in specs[: len(held)]], dtype=torch.float32)  # as TRL's float32 tensor
        if not torch.equal(built, held):  # a weight changed: only those specs take the held value
            changed = [s if b == w else replace(s, weight=w) for s, b, w in zip(specs, built.tolist(), held.tolist())]
            runner.specs = changed + specs[len(held) :]
            self.trainer.runner_weights = [s.weight for s in runner.specs]


def connect(facade: Any, trainer: Any) -> None:
    """The built run's reward stage (and evaluation's, when it is the same runner) in a HeldRewards."""
    held = HeldRewards(facade, trainer, trainer.runner)
    if trainer.eval_runner is trainer.runner:
        trainer.eval_runner = held
    trainer.runner = held
