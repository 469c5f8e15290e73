"""TRL's ``evaluate()``: the eval prompts sampled and scored as in training, under TRL's metric names.

TRL evaluates by running its training batch through the model without an update: each eval batch
of ``per_device_eval_batch_size`` completions is ``batch / num_generations_eval`` prompts, each
sampled ``num_generations_eval`` times with the training sampling settings, scored by every reward
function, and the on-policy loss (importance ratio 1) computed. Metrics are averaged over the eval
batches and prefixed ``eval_``: ``eval_loss``, ``eval_reward``, ``eval_rewards/<func>/mean`` ...,
plus ``eval_runtime``, ``eval_samples_per_second`` and ``eval_steps_per_second``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from grpokit.algo.advantages import group_advantages
from grpokit.algo.loss import policy_loss
from grpokit.algo.masks import ended_rows, overlong_filter
from grpokit.rollout.finish import end_ids
from grpokit.train.token_batch import make_token_batch
from grpokit.types import Prompt

from . import memory
from .inputs import row_loader, rows_of
from .reward_stats import reward_scaling, trl_reward_metrics
from .round_tokens import sampling_extras

CLIP_KEYS = (
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
)


def _eval_mask(trainer: Any, batch, ro):
    """TRL's eval loss and entropy leave masked truncated completions out, as training: algo.mask_truncated
    through training's own overlong_filter (the finish-or-last-token choice made in one place)."""
    a = trainer.cfg.algo
    if not a.mask_truncated:
        return batch.completion_mask
    ended = ended_rows(ro.completion_ids, end_ids(trainer.eos, trainer.tokenizer.pad_token_id))
    return overlong_filter(batch.completion_mask, ro.finish_reasons, a.truncated_by, ended)


def eval_batch_metrics(
    trainer,
    prompts: list[Prompt],
    G: int,
    scaling: tuple[str, str] = ("group", "sum_then_normalize"),
    loss_of: Any = None,
) -> dict[str, float]:
    """One eval batch on grpokit's internal ``trainer``: sample, score, on-policy loss (with beta * KL to the
    reference when the loss has a KL term, as TRL's in every mode); TRL's keys, no prefix. ``scaling`` is
    TRL's (scale_rewards, multi_objective_aggregation), read by ``frac_reward_zero_std``; ``loss_of`` (a
    subclass's loss override, contract/eval_loss.py) replaces the loss value."""
    cfg, a = trainer.cfg, trainer.cfg.algo
    sb = trainer.sample_and_score(prompts, G)
    ro, P = sb.rollout, len(prompts)
    batch = make_token_batch(ro, trainer.tokenizer.pad_token_id, trainer.device)
    logp, entropy = trainer.logprobs(trainer.model, batch, entropy=True)
    if G > 1:  # an unscorable completion (every function returned None) is NaN: left out, advantage 0 (as TRL)
        rewards = torch.where(sb.scored_N, sb.total_N, torch.full_like(sb.total_N, float("nan")))
        adv, _ = group_advantages(rewards.view(P, G), baseline=a.baseline, scale=a.scale, std=a.std, eps=a.adv_eps)
    else:  # num_generations_eval=1: each completion is its own group mean, so its advantage is 0 (as TRL)
        adv = torch.zeros(P, 1)
    mask = _eval_mask(trainer, batch, ro)
    kl = _kl_options(trainer, batch)
    ctrl = trainer.stage_state("entropy_control")  # TRL's eval loss carries the bonus the next train step applies
    coef = ctrl.applied() if ctrl is not None else a.entropy_coef
    loss, m = policy_loss(
        logp,
        logp,
        adv.flatten().to(logp.device),
        mask,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        aggregation=a.aggregation,
        num_sequences=float(P * G),
        num_tokens=float(mask.sum().item()),
        norm_constant=float(a.norm_constant or cfg.rollout.max_new_tokens),
        entropy_NT=entropy,
        entropy_coef=coef,
        entropy_aggregation=a.entropy_aggregation,
        **kl,
    )
    if loss_of is not None:
        loss = torch.tensor(loss_of(trainer.model, batch, adv.flatten(), mask, kl.get("ref_logp_NT")))
    lengths = ro.model_lengths()
    ent = float((entropy * mask).sum().item() / max(mask.sum().item(), 1.0))
    out = {
        "loss": float(loss.item()),
        **sampling_extras(ro, lengths),
        "completions/mean_length": sum(lengths) / len(lengths),
        "completions/min_length": float(min(lengths)),
        "completions/max_length": float(max(lengths)),
        "completions/clipped_ratio": ro.finish_reasons.count("length") / len(lengths),
    }
    weights = [spec.weight for spec in trainer.runner.specs]  # TRL's metrics, as in training:
    out.update(trl_reward_metrics(sb.rewards_NF, weights, sb.names, G, *scaling, failed_NF=sb.failed_NF))
    out["entropy"] = ent
    logged = trainer.runner.logged_names  # what reward functions passed log_metric, this batch's mean (TRL's)
    out.update({k: v for k, v in sb.metrics.items() if k in logged and k not in out})
    out.update({k: 0.0 for k in CLIP_KEYS})  # on-policy: the ratio is 1, nothing is clipped
    if kl:
        out["kl"] = m["kl"]
    if a.entropy_coef != 0.0 or a.entropy_adaptive:  # TRL's policy_loss: the loss before the entropy bonus
        out["policy_loss"] = out["loss"] + m.get("entropy/bonus", 0.0)
    return out


def _kl_options(trainer, batch) -> dict[str, Any]:
    """policy_loss's KL keywords (beta, estimator, bias correction, clamp: the training loss's KLSettings,
    algo/pipeline.loss_settings; log pi_ref of ``batch``) when the loss has a KL term, else none."""
    from grpokit.algo.pipeline import loss_settings
    from grpokit.train import reference

    kl = loss_settings(trainer.cfg.algo)[0].kl
    if not kl.beta:
        return {}
    ref = reference.reference_logprobs(trainer.model, trainer.ref_model, batch, trainer.logprobs, trainer.ref_adapter)
    return dict(
        beta=kl.beta,
        kl_estimator=kl.estimator,
        kl_bias_correction=kl.bias_correction,
        kl_clamp=kl.clamp,
        ref_logp_NT=ref,
    )


def evaluate(
    trainer,
    prompts: list[Prompt],
    G: int,
    batch_size: int,
    prefix: str = "eval",
    on_batch=lambda: None,
    scaling: tuple[str, str] = ("group", "sum_then_normalize"),
    loss_of: Any = None,
) -> dict[str, Any]:
    """TRL's evaluation over ``prompts`` (``batch_size`` completions per batch); returns prefixed metrics.
    ``on_batch()`` runs after each batch (transformers' on_prediction_step)."""
    start, per_batch, sums = time.perf_counter(), max(1, batch_size // G), {}
    batches = [prompts[s : s + per_batch] for s in range(0, len(prompts), per_batch)]
    was_training = trainer.model.training
    trainer.runner.reopen()  # evaluate() after train(): the loop closed the runner's workers
    for chunk in batches:
        for key, value in eval_batch_metrics(trainer, chunk, G, scaling, loss_of).items():
            sums.setdefault(key, []).append(value)
        on_batch()
    trainer.model.train(was_training)
    runtime = time.perf_counter() - start
    out = {
        f"{prefix}_loss": sum(sums.pop("loss")) / len(batches),
        f"{prefix}_runtime": round(runtime, 4),
        f"{prefix}_samples_per_second": round(len(prompts) / max(runtime, 1e-9), 3),
        f"{prefix}_steps_per_second": round(len(batches) / max(runtime, 1e-9), 3),
    }
    sums.pop("num_tokens")  # TRL's eval_num_tokens is the training run's token count (the caller adds it)
    out.update({f"{prefix}_{k}": sum(v) / len(v) for k, v in sums.items()})
    return out


def evaluate_rows(facade: Any, data: Any, metric_key_prefix: str) -> dict[str, float]:
    """GRPOTrainer.evaluate() on one dataset (its memory stage started): the metrics logged, on_evaluate, returned."""
    from .contract.eval_loss import loss_hook, refuse_generation_override

    refuse_generation_override(facade)
    trainer, a = facade._get(), facade.args
    rows = rows_of(data, "eval_dataset", a.remove_unused_columns, whole_stream=True)
    prompts = trainer.make_prompts(rows)  # images through the model's processor, as the training rows
    # transformers hands callbacks the eval loader from the first evaluation on
    G_eval = a.num_generations_eval or a.num_generations
    facade.bridge.user.objects["eval_dataloader"] = row_loader(rows, a.per_device_eval_batch_size, G_eval)
    facade._evaluating = True
    try:
        metrics = evaluate(
            trainer,
            prompts,
            a.num_generations_eval or a.num_generations,
            a.per_device_eval_batch_size,
            metric_key_prefix,
            on_batch=lambda: facade.bridge.user("on_prediction_step"),
            scaling=reward_scaling(facade.args),
            loss_of=loss_hook(facade),
        )
        metrics[f"{metric_key_prefix}_num_tokens"] = float(facade.state.num_input_tokens_seen)
    finally:
        facade._evaluating = False
    memory.stop(facade._memory_tracker, "eval", metrics)
    facade.log(metrics)
    facade.bridge.user("on_evaluate", metrics=metrics)
    return {**metrics, "epoch": facade.state.epoch}
