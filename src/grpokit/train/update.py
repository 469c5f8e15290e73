"""Stage 6: the optimizer step over micro-batches with gradient accumulation.

The loss functions take the whole batch's normalisers (sequence and token counts), so summing the
micro-batches' gradients gives exactly the whole batch's gradient (tests/algo/test_loss.py proves it on
tensors, tests/train/test_train.py on a model).

An update is two calls: ``accumulate`` backpropagates one slice into the parameters' ``.grad`` (its
metric sums go to an ``Accumulator``), ``apply_update`` clips and steps. One slice makes one update
by default; train.accumulation_slices > 1 lets k slices of successive batches share an update
(TRL's rolling window when steps_per_generation is not a multiple of gradient_accumulation_steps).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from typing import Callable

import torch

from grpokit.algo.contexts import WEIGHT
from grpokit.algo.distill import forward_kl_loss
from grpokit.algo.loss import objective_loss
from grpokit.algo.pipeline import UpdateInputs, on_support
from grpokit.algo.settings import EntropyBonus, LossSettings, LossTensors, Normalisers
from grpokit.algo.tis import mismatch_metrics, mismatch_sums
from grpokit.config.sections import OptimConfig
from grpokit.optim.decay import param_groups
from grpokit.optim.optimizers import build_optimizer
from grpokit.optim.schedule import make_scheduler
from grpokit.record.rank_reduction import extreme
from grpokit.rollout.step_graphs import CAPTURE_GUARD
from grpokit.types import TokenBatch

from . import distill_pass
from .logprobs import completion_logprobs, logprobs_with_router_loss
from .prefix_tree import tokens_saved
from .token_budget import micro_batches
from .update_windows import SliceCounts, batch_counts, window_counts


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    """``(optimizer, scheduler)`` of the model's trainable parameters: ``optim.optimizer`` (optimizers.py)
    and its learning-rate schedule over ``total_steps`` updates (schedule.py), stepped once per update;
    weight decay on every parameter or transformers' groups (``optim.decay_norms_and_biases``, decay.py)."""
    optimizer = build_optimizer(param_groups(model, cfg.weight_decay, cfg.decay_norms_and_biases), cfg)
    return optimizer, make_scheduler(optimizer, cfg, total_steps)


def update_slices(inputs: UpdateInputs, parts: int) -> list[UpdateInputs]:
    """``inputs`` cut, in row order, into ``parts`` equal slices, one optimizer update each (TRL's
    steps_per_generation); the loop gives each slice TRL's normalisers (``window_counts``)."""
    if parts == 1:
        return [inputs]
    rows = inputs.batch.input_ids.shape[0]
    if rows % parts:  # validation keeps every batch divisible (dynamic sampling: parts | group size); never drop rows
        raise ValueError(f"a batch of {rows} rows does not cut into {parts} equal updates")
    n = rows // parts
    return [_rows_of(inputs, slice(k * n, (k + 1) * n)) for k in range(parts)]


def _rows_of(inputs: UpdateInputs, rows: slice) -> UpdateInputs:
    cut = lambda t: t[rows] if t is not None else None  # noqa: E731
    weights = inputs.seq_weights
    shifted = (lambda r: weights(slice(r.start + rows.start, r.stop + rows.start))) if weights is not None else None
    return dataclasses.replace(
        inputs,
        batch=inputs.batch.rows(rows),
        advantages=inputs.advantages[rows],
        loss_mask=inputs.loss_mask[rows],
        policy_mask=cut(inputs.policy_mask),
        policy_weight=cut(inputs.policy_weight),
        old_logp=cut(inputs.old_logp),
        ref_logp=cut(inputs.ref_logp),
        turn_ids=cut(inputs.turn_ids),
        seq_weights=shifted,
        sampler_logp=cut(inputs.sampler_logp),
        sampler_mask=cut(inputs.sampler_mask),
        sampler_log_weight=cut(inputs.sampler_log_weight),
        support_mass=cut(inputs.support_mass),
        teacher_top_k=inputs.teacher_top_k.rows(rows) if inputs.teacher_top_k is not None else None,
    )


def _loss_records(inputs: UpdateInputs) -> tuple[LossSettings, Normalisers]:
    """The loss records of this update (``update_inputs`` sets them)."""
    if inputs.loss is None or inputs.norms is None:
        raise ValueError(
            "UpdateInputs.loss and .norms are None; build the inputs with algo.pipeline.update_inputs, "
            "or give both (algo.pipeline.loss_settings makes them from an AlgoConfig)"
        )
    return inputs.loss, inputs.norms


def add_mismatch(acc: dict[str, float], inputs: UpdateInputs, rows, old_logp: torch.Tensor, mb: TokenBatch) -> None:
    """Add one micro-batch's sampler/trainer mismatch sums to ``acc``. ``old_logp`` is pi_old of the
    rows (the trainer's pass before this step's optimizer update, or this forward's own detached
    values when no separate pass ran), so measuring costs no extra forward."""
    if inputs.sampler_logp is None:
        return
    if inputs.support_mass is not None:  # truncated sampling: pi_old renormalised over the sampler's support
        old_logp = on_support(old_logp, inputs.support_mass[rows])
    mask = inputs.sampler_mask[rows] if inputs.sampler_mask is not None else mb.completion_mask
    low, high = inputs.mismatch.low, inputs.mismatch.high
    for k, v in mismatch_sums(
        old_logp, inputs.sampler_logp[rows].to(old_logp.device), mask.to(old_logp.device), low, high
    ).items():
        acc[k] = max(acc.get(k, 0.0), v) if extreme(k) == "max" else acc.get(k, 0.0) + v


@dataclasses.dataclass
class Accumulator:
    """One optimizer update in the making: how many slices were backpropagated into the parameters'
    ``.grad`` so far, and their metric sums (``apply_update`` turns them into the update's metrics).
    It is all plain numbers, so a checkpoint can carry a pending update (train/loop.py)."""

    slices: int = 0
    loss: float = 0.0  # the loss summed over micro-batches
    tokens: float = 0.0  # the slices' loss tokens (over every rank): divisor of the token-weighted metrics
    sums: dict = dataclasses.field(default_factory=dict)  # token-weighted metric sums (unit-weighted: units)
    units: dict = dataclasses.field(default_factory=dict)  # a share's own units summed (objective_loss's weight/)
    extremes: dict = dataclasses.field(default_factory=dict)  # *_min / *_max metrics: the update's min / max
    ent_sum: float = 0.0  # entropy over the loss mask's tokens (add_loss_metrics)
    ent_tok: float = 0.0
    terms: dict = dataclasses.field(
        default_factory=lambda: dict.fromkeys(("entropy/bonus", "sum", "tokens", "aux_loss"), 0.0)
    )
    mismatch: dict = dataclasses.field(default_factory=dict)  # sampler/trainer mismatch sums
    bonus: EntropyBonus = dataclasses.field(default_factory=EntropyBonus)  # the update's entropy bonus settings
    sampled: bool = False  # a slice carried sampler log-probabilities (mismatch metrics)


@dataclasses.dataclass(frozen=True)
class Forwards:
    """How the update's forward passes run: the same for every slice of a run."""

    temperature: float = 1.0  # the loss's (Trainer.loss_temperature): pi_theta at the temperature pi_old was taken at
    micro_batch_size: int = 0  # rows per micro-batch (0: no limit)
    micro_batch_tokens: int = 0  # tokens per micro-batch (0: no limit)
    packed: bool = False  # padding-free forwards (packing.py; same values as padded)
    prefix_tree: bool = False  # shared-prefix forwards (prefix_tree.py; same values as unshared)
    router_aux: float = (
        0.0  # weight of a Mixture-of-Experts router loss (model_options.py), added per micro-batch by its rows
    )
    autocast: Callable | None = None  # a context manager factory for the forwards (None: none)

    def amp(self):
        """The forwards' autocast context (a null one without ``autocast``)."""
        return self.autocast() if self.autocast is not None else contextlib.nullcontext()


def accumulate(
    model,
    optimizer,
    inputs: UpdateInputs,
    acc: Accumulator,
    fw: Forwards,
    *,
    dist=None,
    counts: SliceCounts | None = None,
) -> None:
    """Backpropagate one slice, micro-batch by micro-batch, into the parameters' ``.grad`` and add its
    metric sums to ``acc`` (a fresh ``acc`` starts from zero gradients). Micro-batches hold at most
    ``fw.micro_batch_size`` rows and ``fw.micro_batch_tokens`` tokens; their gradients add up to the
    slice's, since every normaliser is the slice's own: its sequence and token counts (over every rank
    of ``dist``, a ``distributed.DistContext``), or ``counts`` (``window_counts``) when slices share an update."""
    N = inputs.batch.input_ids.shape[0]
    row_tokens = inputs.batch.attention_mask.sum(dim=1).tolist() if fw.micro_batch_tokens else [0] * N
    settings, norms = begin_slice(model, optimizer, inputs, acc, dist=dist, counts=counts)
    for rows in micro_batches(row_tokens, fw.micro_batch_size, fw.micro_batch_tokens):
        _micro_step(model, inputs, rows, settings, norms, acc, fw)


def begin_slice(
    model,
    optimizer,
    inputs: UpdateInputs,
    acc: Accumulator,
    *,
    dist=None,
    counts: SliceCounts | None = None,
) -> tuple[LossSettings, Normalisers]:
    """What every loss stage does before its micro-batches: the slice's loss records and normalisers
    (``counts``, taken once for the batch, replacing its own when slices share an update: no collective
    then), the model in training mode, the gradient zeroed on an update's first slice, ``acc`` told of the slice."""
    counts = counts or window_counts(batch_counts(inputs, 1, dist), 0, parts=1, window=1)  # the slice is an update
    settings, norms = _loss_records(inputs)
    norms = dataclasses.replace(
        norms,
        num_sequences=counts.num_sequences,
        num_tokens=counts.num_tokens,
        num_policy_tokens=counts.num_policy_tokens,
    )
    acc.tokens += counts.slice_tokens
    model.train()
    if acc.slices == 0:
        optimizer.zero_grad(set_to_none=True)
    acc.slices, acc.bonus, acc.sampled = (
        acc.slices + 1,
        settings.entropy,
        acc.sampled or inputs.sampler_logp is not None,
    )
    return settings, norms


def _micro_step(
    model, inputs: UpdateInputs, rows: slice, settings: LossSettings, norms: Normalisers, acc: Accumulator, fw: Forwards
) -> None:
    """Forward and backward one micro-batch; its loss and metric sums go to ``acc``."""
    mb = inputs.batch.rows(rows)
    top = inputs.teacher_top_k.rows(rows) if inputs.teacher_top_k is not None else None
    with CAPTURE_GUARD:  # no draw from the default CUDA generator while a sampler thread captures (step_graphs.py)
        with fw.amp():
            logp, entropy, aux = _forward(model, mb, fw, settings.entropy.coef != 0.0, top)
        if fw.prefix_tree and not fw.router_aux and mb.vision is None:  # what the tree's row did not compute again
            acc.terms["shared_prefix_saved"] = acc.terms.get("shared_prefix_saved", 0.0) + tokens_saved(mb)
        tensors = _loss_tensors(inputs, rows, mb, logp, entropy)
        old = tensors.old_logp
        loss, m = objective_loss(tensors, settings, norms)
        if top is not None:  # algo.distill_top_k: the forward KL to the teacher, reduced as the policy loss
            term, sums = forward_kl_loss(top, aux, tensors.mask, norms, tensors.seq_weights)
            loss, aux = loss + term, None
            for k, v in sums.items():  # token sums; apply_update divides by the loss tokens
                acc.sums[k] = acc.sums.get(k, 0.0) + v
        if aux is not None:  # TRL adds coef * the mean over its micro-batches; here each weighs by its rows
            share = (rows.stop - rows.start) / norms.num_sequences
            loss, acc.terms["aux_loss"] = (
                loss + fw.router_aux * share * aux,
                acc.terms["aux_loss"] + share * float(aux.detach()),
            )
        loss.backward()
    acc.loss += loss.item()
    policy = inputs.policy_mask[rows] if inputs.policy_mask is not None else None
    add_loss_metrics(acc, m, entropy, inputs.loss_mask[rows], policy)
    add_mismatch(acc.mismatch, inputs, rows, old, mb)


def add_loss_metrics(
    acc: Accumulator, m: dict[str, float], entropy_NT, loss_mask_NT, policy_mask_NT: torch.Tensor | None = None
) -> None:
    """Add one micro-batch's ``objective_loss`` metrics ``m`` to ``acc``: what the update logs as kl,
    clip_ratio/*, ratio/mean ...; the entropy over ``loss_mask_NT``, as TRL's (truncated completions masked out
    leave it; the entropy top-fraction's other tokens stay: that mask narrows the policy term only); with the
    bonus on, its entropy over ``policy_mask_NT`` (None: the loss mask's, the same sums, taken once)."""
    m = dict(m)
    n_tok = m.pop("num_tokens")
    ent = _entropy_sums(entropy_NT, loss_mask_NT)
    acc.ent_sum, acc.ent_tok = acc.ent_sum + ent[0], acc.ent_tok + ent[1]
    if "entropy/bonus" in m:  # a sum over micro-batches, as the loss
        on_policy = ent if policy_mask_NT is None else _entropy_sums(entropy_NT, policy_mask_NT)
        _add_bonus(acc.terms, m.pop("entropy/bonus"), on_policy)
    _add_loss_metrics(acc, m, n_tok)


def _add_loss_metrics(acc: Accumulator, m: dict[str, float], n_tok: float) -> None:
    """Add one micro-batch's ``objective_loss`` metrics to ``acc``: a share with a ``weight/<name>`` entry
    weighed by those units (the clip ratios: sequences at a sequence-wide ratio level), a min / max by its name
    (rank_reduction.extreme) kept as the update's min / max (NaN while no sequence had one), ``offpolicy/``
    counts summed, every other metric weighed by the micro-batch's loss tokens."""
    units = {k.removeprefix(WEIGHT): v for k, v in m.items() if k.startswith(WEIGHT)}
    for k, v in m.items():
        if k.startswith(WEIGHT):
            continue
        if extreme(k) is not None:
            acc.extremes[k] = _extreme(acc.extremes.get(k, math.nan), v, lowest=extreme(k) == "min")
        elif k in units:
            acc.sums[k] = acc.sums.get(k, 0.0) + v * units[k]
            acc.units[k] = acc.units.get(k, 0.0) + units[k]
        else:
            acc.sums[k] = acc.sums.get(k, 0.0) + (v if k.startswith("offpolicy/") else v * n_tok)


def _extreme(a: float, b: float, lowest: bool) -> float:
    """The min (``lowest``) or max of two numbers, NaN standing for none (NaN only when both are)."""
    if math.isnan(a) or math.isnan(b):
        return b if math.isnan(a) else a
    return min(a, b) if lowest else max(a, b)


def apply_update(
    optimizer, scheduler, acc: Accumulator, optim: OptimConfig, *, dist=None, router_aux: float = 0.0
) -> dict[str, float]:
    """The optimizer step on the gradient ``acc`` holds: sum it over ranks, clip its norm, step (a
    non-finite loss or norm skips the step); returns the update's metrics."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if dist is not None and dist.active:  # sum gradients and the metric sums over ranks
        dist.sync_grads(params)
    loss_total, ent_sum, ent_tok, terms, sums, units, mismatch = _summed(acc, dist)
    max_norm = optim.max_grad_norm if optim.max_grad_norm > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    metrics = {
        k: (v if k.startswith("offpolicy/") else v / max(units.get(k, acc.tokens), 1.0)) for k, v in sums.items()
    }
    metrics.update(acc.extremes)  # per rank, as the mismatch maxima: reduce_metrics takes the min / max over ranks
    metrics.update(
        loss=loss_total,
        grad_norm=grad_norm,
        learning_rate=scheduler.get_last_lr()[0],
        entropy=ent_sum / max(ent_tok, 1.0),
    )
    metrics.update(_term_metrics(terms, loss_total, acc.bonus, router_aux))
    # the max stays per rank; reduce_metrics takes the max over ranks. No token the sampler scored (the
    # generate engine's placeholder zeros): no figure, rather than a mismatch of 0 nobody measured
    if acc.sampled and mismatch.get("tokens", 0.0) > 0:
        metrics.update(mismatch_metrics(mismatch))
    metrics["skipped_nonfinite"] = _step(optimizer, scheduler, math.isfinite(loss_total) and math.isfinite(grad_norm))
    return metrics


def _summed(acc: Accumulator, dist) -> tuple:
    """``(loss, entropy sum, entropy tokens, terms, sums, units, mismatch)`` of ``acc`` over every rank, in one
    all-reduce (every rank holds the same keys; a mismatch maximum stays this rank's: reduce_metrics takes it)."""
    groups = [
        dict(sorted(d.items()))
        for d in (acc.terms, acc.sums, acc.units, {k: v for k, v in acc.mismatch.items() if extreme(k) != "max"})
    ]
    flat = [acc.loss, acc.ent_sum, acc.ent_tok, *(v for g in groups for v in g.values())]
    out = iter(dist.sum_floats(flat) if dist is not None and dist.active else flat)
    loss, ent_sum, ent_tok = next(out), next(out), next(out)
    terms, sums, units, mismatch = ({k: next(out) for k in g} for g in groups)
    return loss, ent_sum, ent_tok, terms, sums, units, {**acc.mismatch, **mismatch}


def _loss_tensors(
    inputs: UpdateInputs, rows: slice, mb: TokenBatch, logp: torch.Tensor, entropy: torch.Tensor
) -> LossTensors:
    """The objective's tensors of one micro-batch (pi_old: this forward's own detached values on-policy)."""
    cut = lambda t: t[rows] if t is not None else None  # noqa: E731
    return LossTensors(
        logp,
        inputs.old_logp[rows] if inputs.old_logp is not None else logp.detach(),
        inputs.advantages[rows],
        inputs.loss_mask[rows],
        ref_logp=cut(inputs.ref_logp),
        entropy=entropy,
        turn_ids=cut(inputs.turn_ids),
        seq_weights=inputs.seq_weights(rows) if inputs.seq_weights is not None else None,
        ratio_mask=mb.completion_mask,
        sampler_log_weight=cut(inputs.sampler_log_weight),
        policy_mask=cut(inputs.policy_mask),
        policy_weight=cut(inputs.policy_weight),
    )


def _entropy_sums(entropy_NT: torch.Tensor, mask_NT: torch.Tensor) -> tuple[float, float]:
    """One micro-batch's entropy sum and token count over ``mask_NT``."""
    mask = mask_NT.to(entropy_NT.device, entropy_NT.dtype)
    return float((entropy_NT.detach() * mask).sum().item()), float(mask.sum().item())


def _term_metrics(acc: dict[str, float], loss_total: float, bonus, router_aux: float) -> dict[str, float]:
    """TRL's ``policy_loss`` (the loss before the entropy bonus), ``entropy_coef`` and the loss tokens'
    mean entropy while the bonus is on (or adaptive); ``aux_loss`` (row-weighted mean) with a router loss."""
    out = {}
    if bonus.coef != 0.0 or bonus.adaptive:
        out.update(
            {
                "policy_loss": loss_total + acc["entropy/bonus"],
                "entropy_coef": bonus.coef,
                "entropy/loss_tokens_mean": acc["sum"] / max(acc["tokens"], 1.0),
            }
        )
    if router_aux:
        out["aux_loss"] = acc["aux_loss"]
    if "shared_prefix_saved" in acc:  # train.packing=prefix_tree: tokens the update's forwards shared
        out["train/shared_prefix_tokens_saved"] = acc["shared_prefix_saved"]
    return out


def _forward(model, mb: TokenBatch, fw: Forwards, entropy_grad: bool, top=None):
    """``(logp, entropy, router loss or None)`` of one micro-batch: with a router loss to add, the
    model's own forward (it computes that loss); else grpokit's chunked log-probabilities. With the
    teacher's top-k (``top``), the third value is the student's ``(n, T, K)`` log-probabilities of its ids."""
    if top is not None:
        if fw.router_aux:
            raise ValueError(
                "algo.distill_top_k cannot run with a Mixture-of-Experts router loss (model.router_aux_loss_coef); "
                "set one of them to 0"
            )
        return distill_pass.student_logprobs(model, mb, top.ids, fw.temperature, entropy_grad)
    if fw.router_aux:
        return logprobs_with_router_loss(model, mb, fw.temperature, entropy_grad)
    logp, entropy = completion_logprobs(
        model,
        mb,
        temperature=fw.temperature,
        with_entropy=True,
        entropy_grad=entropy_grad,
        packed=fw.packed,
        prefix_tree=fw.prefix_tree,
    )
    return logp, entropy, None


def _add_bonus(acc: dict[str, float], bonus: float, policy_entropy: tuple[float, float]) -> None:
    """Add one micro-batch's entropy bonus and its policy tokens' entropy sum and count (``_entropy_sums``) to
    ``acc`` (adaptive entropy control measures the tokens the bonus acts on: TRL's controller reads the same set)."""
    acc["entropy/bonus"] += bonus
    acc["sum"] += policy_entropy[0]
    acc["tokens"] += policy_entropy[1]


def _step(optimizer, scheduler, finite: bool) -> float:
    """Apply the step when loss and gradient norm are finite; returns 1.0 when it was skipped."""
    if finite:
        optimizer.step()
        scheduler.step()
        return 0.0
    optimizer.zero_grad(set_to_none=True)  # a non-finite step is skipped, never applied
    with warnings.catch_warnings():  # the schedule still advances, so a resumed run stays aligned
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step()
    return 1.0
