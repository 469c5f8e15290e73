"""lambda-GRPO's learnable token preference (Wang et al., arXiv 2510.06870): the state around the
pure ``loss.lambda_weights``.

lambda is one trained scalar. Each update's policy loss (``algo.aggregation=lambda-grpo``) weighs
completion i's tokens by ``f_lambda(o_i)``; the loss's gradient reaches lambda through those
weights, and lambda takes its own optimizer step (Adam, ``algo.lambda_lr``, no schedule, no
weight decay, not part of the model's gradient-norm clip) after the model's. Its value is logged
every step (``lambda_grpo/lambda``) and saved in every checkpoint, so a resumed run continues with
the same lambda and the same Adam moments.
"""

from __future__ import annotations

from typing import Callable

import torch

from .loss import lambda_weights


class LearnableLambda:
    """lambda, its optimizer, and the weights it gives a batch; a ``StageState`` (stage_state.py)."""

    key = "lambda_grpo"
    required = True  # a run resumed without its lambda would restart it at init

    def __init__(self, init: float, lr: float, r: float, betas: tuple[float, float] = (0.9, 0.99)):
        self.param = torch.nn.Parameter(torch.tensor(float(init)))
        self.optimizer = torch.optim.Adam([self.param], lr=lr, betas=betas)
        self.r = r

    def weight_fn(self, lengths_N: torch.Tensor, group_size: int) -> Callable[[slice], torch.Tensor]:
        """``rows -> f_lambda`` of those rows, computed from the whole batch's lengths at every call,
        so each micro-batch's backward builds its own small graph to lambda (same gradient as one
        batch: the weights depend only on lengths and lambda)."""
        lengths = lengths_N.detach().float().cpu()
        return lambda rows: lambda_weights(lengths, group_size, self.param, r=self.r)[rows].to(lengths_N.device)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def before_update(self, inputs):
        """lambda's gradient is this update's (one slice an update)."""
        self.zero_grad()
        return inputs

    def after_update(self, metrics: dict[str, float], dist=None) -> dict[str, float]:
        """lambda's own step, on the gradient the update's backward gave it."""
        return self.step(dist)

    def step(self, dist=None) -> dict[str, float]:
        """Sum lambda's gradient over ranks and step (skipped when it is missing or not finite)."""
        if dist is not None:
            dist.sync_grads([self.param])
        grad = self.param.grad
        ok = grad is not None and bool(torch.isfinite(grad).all())
        if ok:
            self.optimizer.step()
        return {"lambda_grpo/lambda": float(self.param.detach()), "lambda_grpo/grad": float(grad) if ok else 0.0}

    def state_dict(self) -> dict:
        return {"lambda": self.param.detach().clone(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.param.copy_(state["lambda"])
        self.optimizer.load_state_dict(state["optimizer"])
