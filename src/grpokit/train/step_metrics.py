"""Stage 7's inputs from one step: the metrics line and the sample rows.

``Trainer._step_metrics`` (train/loop.py) calls these with the step's scored batch, the update's
inputs and the update's metrics; it reduces the line over ranks and hands both to the recorder.
Metric names follow TRL's where the concept is the same (``completions/mean_length``, ``reward_std``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from grpokit.record.samples import sample_rows
from grpokit.record.signatures import group_signatures, solved_signatures
from grpokit.record.vision_samples import with_images
from grpokit.rollout.episode_metrics import episode_metrics
from grpokit.types import ScoredBatch

from .rollout_func import add_logged_columns
from .timer import Timer

# How a step's several optimizer updates (algo.num_iterations x train.updates_per_batch) become one line:
LAST_OF_UPDATES = ("learning_rate", "entropy_coef", "lambda_grpo/lambda")  # states: the one in force at the end
SUM_OF_UPDATES = ("skipped_nonfinite", "train/shared_prefix_tokens_saved")  # counts over the step
STEP_ONLY = ("grad_norm/max",)  # the step's own (not one update's): grpokit.trl's per-update entries leave it out


def step_update_metrics(updates: list[dict[str, float]]) -> dict[str, float]:
    """One line of the metrics of the optimizer updates a step applied, in order: a key in LAST_OF_UPDATES is
    the last update's, in SUM_OF_UPDATES summed, a ``..._max`` key the max; every other (``loss``,
    ``grad_norm``, ``clip_ratio/*``, ``entropy``, ``ratio/mean`` ...) the mean over the updates that report it;
    plus ``grad_norm/max``, the largest update's norm (a spike the mean would halve). ``{}`` for none (an
    update spanning steps, train.accumulation_slices, still accumulating). One update: its own metrics, and
    ``grad_norm/max`` = ``grad_norm``."""
    out: dict[str, float] = {}
    for k in dict.fromkeys(k for u in updates for k in u):
        vals = [u[k] for u in updates if k in u]
        if k in LAST_OF_UPDATES:
            out[k] = vals[-1]
        elif k in SUM_OF_UPDATES:
            out[k] = sum(vals)
        elif k.endswith("_max"):
            out[k] = max(vals)
        else:
            out[k] = sum(vals) / len(vals)
    norms = [u["grad_norm"] for u in updates if "grad_norm" in u]
    if norms:
        out["grad_norm/max"] = max(norms, key=lambda v: v if v == v else float("inf"))  # a NaN norm is the worst
    return out


def logged_samples(
    sb: ScoredBatch, inputs, max_prompts: int, run_dir: Path, step: int, images: bool = True
) -> list[dict]:
    """The sample rows of step ``step``: prompt, completion, each reward, the sequence's advantage
    (a token-level advantage averaged over the row), length and finish reason; the reward
    functions' logged values; with ``images`` (record.samples_images), image prompts as PNGs with
    boxes drawn, for the report."""
    ro, G = sb.rollout, sb.group_size
    adv = inputs.advantages.cpu()
    seq_adv = adv if adv.dim() == 1 else adv.mean(dim=1)
    per_func = {n: sb.rewards_NF[:, f].tolist() for f, n in enumerate(sb.names)}
    rows = sample_rows(
        [p.text for p in sb.prompts],
        sb.texts,
        per_func,
        sb.total_N.tolist(),
        seq_adv.tolist(),
        ro.model_lengths(),
        ro.finish_reasons,
        G,
        max_prompts=max_prompts,
        messages=[e.messages for e in ro.episodes] if ro.episodes else None,
    )
    rows = add_logged_columns(rows, sb.extra, G)
    return with_images(rows, sb.prompts, run_dir, step) if images else rows


def sampling_metrics(sb: ScoredBatch, inputs, same_length_min_tokens: int) -> dict[str, float]:
    """This rank's metrics of a step known once it is sampled, scored and its advantages taken: rewards,
    the update's inputs, completion lengths (the model's tokens of an episode, as TRL) and the health
    monitors' group and solved signatures."""
    ro, G = sb.rollout, sb.group_size
    P = len(sb.prompts)
    lengths = ro.model_lengths()
    return {
        **sb.metrics,
        **episode_metrics(ro),
        "reward": sb.total_N.mean().item(),
        "reward_std": sb.total_N.view(P, G).std(dim=1, unbiased=False).mean().item(),  # population, as documented
        **inputs.metrics,
        "completions/mean_length": float(np.mean(lengths)),
        "completions/min_length": float(min(lengths)),
        "completions/max_length": float(max(lengths)),
        "completions/clipped_ratio": ro.finish_reasons.count("length") / len(lengths),
        **group_signatures(sb.texts, lengths, G, ro.finish_reasons, same_length_min_tokens),
        # lets the monitors tell convergence from collapse
        **solved_signatures(sb.texts, sb.total_N.tolist(), G),
    }


def step_metrics(
    sb: ScoredBatch,
    inputs,
    update_metrics: dict[str, float],
    timer: Timer,
    same_length_min_tokens: int,
    data_position: int,
) -> dict[str, float]:
    """This rank's metrics of a step: ``sampling_metrics``, the update's, timings and throughput, and the
    data position."""
    lengths = sb.rollout.model_lengths()
    # asynchronous rollout: the sampler's own seconds on this batch; the trainer's rollout span only took it
    rollout_s = update_metrics.get("time/sampling", timer.spans.get("rollout", 0.0))
    return {
        **sampling_metrics(sb, inputs, same_length_min_tokens),
        **update_metrics,
        **timer.metrics(),
        "tokens_per_second": sum(lengths) / max(timer.total(), 1e-9),
        "rollout/tokens_per_second": sum(lengths) / max(rollout_s, 1e-9),
        "data/position": float(data_position),
    }
