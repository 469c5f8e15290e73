"""Adaptive entropy control (Skywork-OR1, He et al., arXiv 2505.22312): the entropy bonus's
coefficient moves toward a target entropy, one step per optimizer step.

After every optimizer step the mean entropy ``H`` of the tokens the loss trained on (the loss mask,
token-weighted over the whole step and every rank) is compared with the target:

    c <- min(c + delta, c_max)   if H <= target     (entropy too low: push it up)
    c <- max(c - delta, c_min)   otherwise

and the next step subtracts ``c * H`` only when that last ``H`` was at or below the target (0 when
above; before the first measurement ``H`` counts as +inf, so the first step has no bonus). Every
micro-batch of one optimizer step applies the same coefficient.

This is what TRL 1.16's GRPOTrainer does (its code; its documentation says "below the target" where
the code compares "at or below", and does not say that the first step carries no bonus). The
coefficient is not clamped to ``[c_min, c_max]`` before its first update, as in TRL.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


def next_coef(coef: float, entropy: float, target: float, delta: float, lo: float, hi: float) -> float:
    """The coefficient after an optimizer step whose measured mean token entropy was ``entropy``."""
    if entropy <= target:  # Skywork-OR1: entropy at or below the target, strengthen the bonus
        return min(coef + delta, hi)
    return max(coef - delta, lo)


def applied_coef(coef: float, last_entropy: float, target: float) -> float:
    """The coefficient the next step's loss uses: ``coef`` while the last measured entropy is at or
    below the target, else 0 (the bonus rests while entropy is high enough)."""
    return coef if last_entropy <= target else 0.0


@dataclass
class EntropyController:
    """The controller's state between optimizer steps: the coefficient and the last measured entropy."""

    coef: float
    target: float
    delta: float
    lo: float
    hi: float
    last_entropy: float = math.inf  # no measurement yet: the first step carries no bonus
    key = "entropy_control"  # a StageState (stage_state.py)
    required = False  # a checkpoint written without it starts the controller afresh

    @classmethod
    def from_algo(cls, a) -> "EntropyController":
        """From ``AlgoConfig``: ``entropy_coef`` is the starting coefficient."""
        return cls(a.entropy_coef, a.entropy_target, a.entropy_coef_delta, a.entropy_coef_min, a.entropy_coef_max)

    def applied(self) -> float:
        return applied_coef(self.coef, self.last_entropy, self.target)

    def update(self, entropy: float) -> None:
        """One optimizer step measured ``entropy`` (mean over its loss tokens)."""
        self.coef = next_coef(self.coef, entropy, self.target, self.delta, self.lo, self.hi)
        self.last_entropy = entropy

    def before_update(self, inputs):
        """The update's inputs (``pipeline.UpdateInputs``) with the coefficient this update applies."""
        if inputs.loss is None:
            return inputs
        bonus = dataclasses.replace(inputs.loss.entropy, coef=self.applied(), adaptive=True)
        return dataclasses.replace(inputs, loss=dataclasses.replace(inputs.loss, entropy=bonus))

    def after_update(self, metrics: dict[str, float], dist=None) -> dict[str, float]:
        """Skywork-OR1: the next update's coefficient from this one's loss-token entropy."""
        self.update(metrics["entropy/loss_tokens_mean"])
        return {"entropy_coef": self.coef}

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])
