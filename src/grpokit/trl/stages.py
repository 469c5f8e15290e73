"""A GRPOTrainer subclass's overrides as the grpokit stages they replace (hooks.py says which).

grpokit's loop calls its stages through the Trainer's slots (``runner.score`` for stage 3, the loss
stage for 5), so an override is honoured by putting an adapter in the slot: the adapter turns
grpokit's records into what TRL passes at that point, calls the trainer's method (the subclass's,
which may call ``super()``: grpokit.trl's own, computing what TRL's computes) and turns the result back.
The loop itself does not change, and a run without overrides keeps grpokit's faster stages.
"""

from __future__ import annotations

from typing import Any

import torch

from grpokit.config.sections import ConfigError
from grpokit.rewards.runner import RewardResult


class TrlRewards:
    """Stage 3 as TRL's ``_calculate_rewards``: ``score`` builds TRL's arguments for the whole batch
    (``inputs``: one dict per completion with ``prompt`` and the dataset's columns; ``prompts``,
    ``completions``, ``completion_ids_list``), calls ``trainer._calculate_rewards`` and weights its
    ``(N, num_reward_funcs)`` tensor into the total, as TRL does (a NaN is a function that does not apply).
    Everything else (``specs``, ``close`` ...) is the wrapped runner's."""

    def __init__(self, facade: Any, runner: Any):
        self.facade, self.runner = facade, runner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def score(
        self,
        prompts: list,
        completions: list,
        completion_ids: list[list[int]],
        group_size: int,
        columns: dict[str, list] | None = None,
        trainer_state: Any = None,
    ) -> RewardResult:
        f = self.facade
        columns = columns or {}
        inputs = [{"prompt": p, **{k: v[i] for k, v in columns.items()}} for i, p in enumerate(prompts)]
        f._reward_call, f._last_scored = (self.runner, group_size, columns, trainer_state), None
        try:
            rewards_NF = f._calculate_rewards(inputs, prompts, completions, completion_ids)
        finally:
            f._reward_call = None
        names = [s.name for s in self.runner.specs]
        rewards_NF = _checked(rewards_NF, len(completions), len(names))
        weights = torch.tensor([s.weight for s in self.runner.specs], dtype=torch.float32)
        total_N = (rewards_NF * weights).nansum(dim=1)
        last = f._last_scored  # what super()._calculate_rewards measured (failures ...), when it was called
        metrics = dict(last.metrics) if last is not None else {}
        for j, name in enumerate(names):
            col = rewards_NF[:, j][~rewards_NF[:, j].isnan()]
            metrics[f"rewards/{name}/mean"] = col.mean().item() if len(col) else float("nan")
            metrics[f"rewards/{name}/std"] = col.std(unbiased=False).item() if len(col) else float("nan")
        metrics.update(reward=total_N.mean().item(), reward_std=total_N.std(unbiased=False).item())
        pending, f._pending_metrics = f._pending_metrics, {}
        metrics.update({k: sum(v) / len(v) for k, v in pending.items() if v})  # log_metric's values
        extra = dict(last.extra) if last is not None else {}
        return RewardResult(rewards_NF, total_N, names, weights.tolist(), metrics, extra)


def _checked(rewards: Any, n: int, num_funcs: int) -> torch.Tensor:
    """The override's result as a CPU float tensor (N, F), or one sentence saying what it returned."""
    if not isinstance(rewards, torch.Tensor) or tuple(rewards.shape) != (n, num_funcs):
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        raise ConfigError(
            f"_calculate_rewards returned {shape}; TRL's contract is a tensor of shape ({n}, {num_funcs}): one row "
            "per completion, one column per reward function"
        )
    return rewards.detach().float().cpu()


def calculate_rewards(facade: Any, inputs: list[dict], prompts: list, completions: list, completion_ids: list) -> Any:
    """grpokit.trl's own ``_calculate_rewards`` (what ``super()._calculate_rewards`` runs): every reward
    function once over the batch through grpokit's reward runner (failures contained and counted),
    keywords as TRL passes them; returns the ``(N, num_reward_funcs)`` tensor, NaN where a function
    returned None."""
    call = facade._reward_call
    if call is None:  # called directly, outside a training or evaluation batch
        trainer = facade._get()
        runner = trainer.runner.runner if isinstance(trainer.runner, TrlRewards) else trainer.runner
        G = facade.args.num_generations
        group = G if len(prompts) % G == 0 else 1
        keys = [k for k in (inputs[0] if inputs else {}) if k not in ("prompt", "completion", "completion_ids")]
        call = (runner, group, {k: [x[k] for x in inputs] for k in keys}, facade.state)
    runner, group, columns, state = call
    result = runner.score(prompts, completions, completion_ids, group, columns, trainer_state=state)
    facade._last_scored = result
    return result.rewards_NF.clone()
