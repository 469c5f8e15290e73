"""The arithmetic of TRL's log history, pure: what an entry's values are (the bridge, bridge.py, decides when
an entry is written). TRL's ``log`` takes the mean of each ``_metrics`` list since the last entry; transformers'
Trainer logs its own values beside them (the window's mean loss, with NaN / inf filtered as
``logging_nan_inf_filter`` says, and the last step's grad_norm and learning_rate), and ends ``train()`` with
one entry of throughput and the mean loss.
"""

from __future__ import annotations

import math

OWN_KEYS = ("loss", "grad_norm", "learning_rate")
"""What transformers' Trainer logs itself (not TRL's ``_metrics``): the window's mean loss, the last step's
grad_norm and learning_rate."""


def take_means(metrics: dict[str, list[float]]) -> dict[str, float]:
    """TRL's ``log``: each value list's mean of ``_metrics[mode]`` over its values that are not NaN (a step whose
    rewards were all None leaves out that step, not the window), None where none is left; then cleared (a
    subclass may hold the dict)."""
    valid = {k: [x for x in v if not math.isnan(x)] for k, v in metrics.items() if v}
    metrics.clear()
    return {k: sum(v) / len(v) if v else None for k, v in valid.items()}


def filtered_loss(loss: float, window: list[float], nan_inf_filter: bool) -> float:
    """transformers' logging_nan_inf_filter: a NaN or inf step loss counts, in the logged mean and in
    train_loss, as the sum of the log window's earlier losses (``window``) over their count plus one (its running
    total over the steps since the last log, this one included); False keeps it as is.
    Example: window [1.0, 2.0], then NaN: (1 + 2) / 3 = 1.0."""
    if math.isfinite(loss) or not nan_inf_filter:
        return loss
    return sum(window) / (len(window) + 1)


def add_values(metrics: dict[str, float], own: dict[str, list[float]], pending: dict[str, list[float]]) -> None:
    """Values for the next log entry: transformers' own (OWN_KEYS) into ``own``, the rest into TRL's
    ``_metrics["train"]`` (``pending``), where ``num_tokens``, a running total, holds its latest value only (as
    TRL's); what is not a number is left out."""
    for key, value in metrics.items():
        if isinstance(value, (int, float)):
            store = own if key in OWN_KEYS else pending
            if key == "num_tokens":
                store[key] = []
            store.setdefault(key, []).append(float(value))


def own_entry(own: dict[str, list[float]]) -> dict[str, float]:
    """transformers' own values of a log entry: the window's mean loss, the last step's grad_norm and
    learning_rate. Example: loss [1.0, 3.0], learning_rate [0.2, 0.1] -> loss 2.0, learning_rate 0.1."""
    return {k: (sum(v) / len(v) if k == "loss" else v[-1]) for k, v in own.items() if v}


def final_entry(
    steps: int, losses: list[float], runtime: float, completions_per_step: int, total_flos: float = 0.0
) -> dict[str, float]:
    """TRL's last log_history entry: throughput of the ``steps`` trained in this call (a resumed run's
    own, as transformers) over ``runtime`` seconds, the mean loss of those steps, the run's ``total_flos``."""
    seconds = max(runtime, 1e-9)
    return {
        "train_runtime": round(runtime, 4),
        "train_samples_per_second": round(steps * completions_per_step / seconds, 3),
        "train_steps_per_second": round(steps / seconds, 3),
        # TRL's GRPO batches carry no input_ids, so transformers adds 0 FLOPs a step: a resumed run's stored total
        "total_flos": float(total_flos),
        "train_loss": sum(losses) / len(losses) if losses else 0.0,
    }
