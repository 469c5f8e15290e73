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
from grpokit.rollout.step_graphs import CAPTURE_GUARD


class TrlRewards:
    """Stage 3 as TRL's ``_calculate_rewards``: ``score`` builds TRL's arguments for the whole batch
    (``inputs``: one dict per completion, its dataset row: ``prompt`` as the dataset holds it, without the
    reset() observation that ``prompts`` carries, its columns and a rollout_func's extra fields; ``prompts``,
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
        columns = dict(columns or {})
        # TRL's reward_kwargs["environments"] is the trainer's, no key of its rows; "prompt": rewards/inputs.py
        environments, rows = columns.pop("environments", None), columns.pop("prompt", prompts)
        inputs = [{"prompt": p, **{k: v[i] for k, v in columns.items()}} for i, p in enumerate(rows)]
        f._reward_call, f._last_scored = (self.runner, group_size, environments, trainer_state), None
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
    keywords as TRL passes them: the keys of the ``inputs`` rows as given (a key the subclass added
    too; the runner leaves out ``prompt``, ``completion`` and ``completion_ids``, TRL's rule) and the
    batch's ``environments``; returns the ``(N, num_reward_funcs)`` tensor, NaN where a function returned None."""
    call = facade._reward_call
    if call is None:  # called directly, outside a training or evaluation batch
        trainer = facade._get()
        runner = trainer.runner.runner if isinstance(trainer.runner, TrlRewards) else trainer.runner
        G = facade.args.num_generations
        call = (runner, G if len(prompts) % G == 0 else 1, None, facade.state)
    runner, group, environments, state = call
    columns = {k: [x[k] for x in inputs] for k in (inputs[0] if inputs else {})}  # TRL: example[key]
    if environments is not None:
        columns["environments"] = environments
    result = runner.score(prompts, completions, completion_ids, group, columns, trainer_state=state)
    facade._last_scored = result
    return result.rewards_NF.clone()


def row_values(value: Any) -> bool:
    """Whether TRL cuts ``value`` of its batch dict with the batch's rows (trl/trainer/utils.py's
    shuffle_sequence_dict and split_tensor_dict): a tensor with a first dimension, a list, a tuple (TRL's
    shuffle makes it a list of its rows). None, a 0-dim tensor (num_items_in_batch) and any other value (a
    number, a string, a dict, on which TRL's shuffle stops or which it takes apart) go whole to every micro-batch."""
    if isinstance(value, torch.Tensor):
        return value.dim() > 0
    return isinstance(value, (list, tuple))


def batch_rows(batch: dict[str, Any], rows: slice) -> dict[str, Any]:
    """Rows ``rows`` of TRL's batch dict, as TRL's split_tensor_dict cuts them: every row value (``row_values``)
    cut, a list or tuple into a list of its rows (TRL's type after its shuffle), the rest kept whole."""
    return {
        k: (v[rows] if isinstance(v, torch.Tensor) else list(v[rows])) if row_values(v) else v for k, v in batch.items()
    }


def batch_dict(batch: Any, advantages: torch.Tensor, loss_mask: torch.Tensor, num_items: float) -> dict[str, Any]:
    """A ``TokenBatch`` as the batch dict TRL's ``compute_loss`` receives: ``prompt_ids`` / ``prompt_mask``
    (left-padded), ``completion_ids`` / ``completion_mask`` (the real completion tokens), ``advantages``,
    ``num_items_in_batch``; ``tool_mask`` where the loss (``loss_mask``) trains on fewer tokens than the
    completion holds (environment tokens, masked completions), as TRL's ``completion_mask * tool_mask``."""
    Lp = batch.input_ids.shape[1] - batch.completion_ids.shape[1]
    completion_mask = batch.attention_mask[:, Lp:]
    out = {
        "prompt_ids": batch.input_ids[:, :Lp],
        "prompt_mask": batch.attention_mask[:, :Lp],
        "completion_ids": batch.completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages.to(batch.input_ids.device),
        "num_items_in_batch": torch.tensor(float(num_items)),
    }
    loss_mask = loss_mask.to(completion_mask.device)
    if not torch.equal(loss_mask.to(completion_mask.dtype), completion_mask):
        out["tool_mask"] = loss_mask.to(completion_mask.dtype)
    return out


def trl_batch(inputs: Any, rows: slice, num_items: float) -> dict[str, Any]:
    """Rows ``rows`` of a slice's ``UpdateInputs`` as TRL's batch dict (``batch_dict``; ``num_items_in_batch``:
    the update's loss tokens), with ``old_per_token_logps``, ``ref_per_token_logps``,
    ``sampling_per_token_logps`` and ``importance_sampling_ratio`` (the policy weight: TRL's vLLM importance
    sampling ratio, which its loss multiplies in beside the advantages) when the step has them."""
    out = batch_dict(inputs.batch.rows(rows), inputs.advantages[rows], inputs.loss_mask[rows], num_items)
    for key, value in (
        ("old_per_token_logps", inputs.old_logp),
        ("ref_per_token_logps", inputs.ref_logp),
        ("sampling_per_token_logps", inputs.sampler_logp),
        ("importance_sampling_ratio", inputs.policy_weight),
    ):
        if value is not None:
            out[key] = value[rows]
    return out


def update_micro_batches(counts: Any, rows: int, rows_each: int) -> int:
    """This rank's micro-batches in the optimizer update a slice belongs to (TRL's
    ``current_gradient_accumulation_steps``, after which accelerate syncs the gradients): its slice's,
    ceil(rows / rows_each) of the ``rows`` this rank holds, times the update's slices (``counts``:
    update_windows.window_counts; its ``window`` is train.accumulation_slices, fewer in an epoch's last
    window; None: a slice is the whole update). Counted from the rank's own rows: the normalisers' sequence
    count is every rank's, which under torchrun would never be reached.
    Example: 4 rows a rank, 2 a micro-batch, 3 slices an update: 2 x 3 = 6, whatever the number of ranks."""
    return -(-rows // rows_each) * (counts.window if counts is not None else 1)


NO_IMAGES = (
    "a GRPOTrainer subclass's compute_loss / _get_per_token_logps_and_entropies (or a "
    "loss_is_scaled_for_ga other than True) cannot be carried out with image inputs under grpokit.trl "
    "(TRL's pixel_values are not rebuilt); use them with text models"
)
"""TRL's loss path refused for image prompts (TrlLoss at each slice, overrides.into_slots when the run is built)."""

NO_TOP_K = (
    "algo.distill_top_k's forward KL to the teacher is a term of grpokit's own loss, which TRL's loss path (a "
    "GRPOTrainer subclass's compute_loss / _compute_loss / _get_per_token_logps_and_entropies / "
    "_generate_and_score_completions, or a loss_is_scaled_for_ga other than True) does not compute; drop the "
    "override or set distill_top_k to 0"
)
"""TRL's loss path refused with the teacher's top-k (TrlLoss at each slice, overrides.into_slots when built)."""


class TrlLoss:
    """Stage 5 as TRL's training step: ``__call__`` has ``train/update.accumulate``'s signature; it cuts
    the slice into TRL's micro-batches of ``per_device_train_batch_size`` rows, passes each as TRL's
    batch dict to ``trainer.compute_loss`` (the subclass's) and back-propagates the loss it returns, divided by
    the update's micro-batches (``current_gradient_accumulation_steps``) where transformers divides it
    (``_scaled``: a subclass setting ``loss_is_scaled_for_ga`` False; TRL's own loss is scaled).
    With K processes the loss is TRL's per-process loss (DDP then averages the K processes' gradients), while
    grpokit sums gradients over processes (train/distributed.py): so ``loss / K`` is back-propagated and
    logged, and the summed gradients and logged losses are DDP's averages. ``super().compute_loss`` returns
    TRL's per-process scale too: grpokit's share of the global loss times K.
    Example: 2 processes, each compute_loss returning 1.0 with gradient 1: each back-propagates 0.5, the
    summed gradient is 1 (DDP's mean of 1 and 1) and the logged loss 0.5 + 0.5 = 1.0 (TRL's mean over ranks).
    ``own`` (grpokit's ``accumulate``) is the stage when the subclass overrides no loss method: it runs
    while ``loss_is_scaled_for_ga`` stays True, which it reads at every slice (so a value set at any time counts)."""

    def __init__(self, facade: Any, own: Any = None):
        self.facade, self.own = facade, own
        self.source: Any = None  # the subclass's generation batch being trained on (generation.TrlGenerate)
        self.offset = 0  # its first row not yet trained on in this pass

    def _rows(self, inputs: Any, N: int, num_items: float) -> Any:
        """``rows -> TRL's batch dict`` of this slice: from the subclass's generation batch when
        _generate_and_score_completions is overridden (slices follow one another through it, once per
        iteration), else from grpokit's update inputs (``num_items``: the update's loss tokens)."""
        gen = self.facade._generation_batch
        if gen is None:
            return lambda rows: trl_batch(inputs, rows, num_items)
        if gen is not self.source:
            self.source, self.offset = gen, 0
        total, first = gen["completion_ids"].shape[0], self.offset
        self.offset = (first + N) % total
        return lambda rows: batch_rows(gen, slice(first + rows.start, first + rows.stop))

    def _scaled(self) -> bool:
        """Whether the loss compute_loss returns is already scaled for gradient accumulation (else it is divided
        by the update's micro-batches): transformers' Trainer.training_step (trainer.py ~2111-2117) takes
        ``loss_is_scaled_for_ga`` when set, else ``(model_accepts_loss_kwargs and num_items_in_batch is not
        None) or compute_loss_func is not None``. TRL's training step always passes num_items_in_batch=None
        (its batches are dicts of rows, without labels to count), so the first term is False under TRL.
        Example: a subclass setting it False, 2 micro-batches of an update each returning 1.0: each
        back-propagates and logs 0.5, the step's logged loss is 1.0."""
        f = self.facade
        if f.loss_is_scaled_for_ga is not None:
            return bool(f.loss_is_scaled_for_ga)
        return getattr(f, "compute_loss_func", None) is not None

    def __call__(self, model, optimizer, inputs, acc, fw, *, dist=None, counts=None) -> None:
        from grpokit.train.update import begin_slice

        f, scaled = self.facade, self._scaled()
        if self.own is not None and scaled:  # no loss override and TRL's scaling: grpokit's faster stage
            return self.own(model, optimizer, inputs, acc, fw, dist=dist, counts=counts)
        if inputs.batch.vision is not None:  # refused when the run is built too (overrides.into_slots); here
            raise ConfigError(NO_IMAGES)  # for a loss_is_scaled_for_ga changed once the run is built
        if inputs.teacher_top_k is not None:  # likewise: compute_loss has no forward KL (train/update.py's term)
            raise ConfigError(NO_TOP_K)
        settings, norms = begin_slice(model, optimizer, inputs, acc, dist=dist, counts=counts)
        K = dist.world_size if dist is not None and dist.active else 1  # DDP's mean = grpokit's sum / K
        N, rows_each = inputs.batch.input_ids.shape[0], f.args.per_device_train_batch_size
        batch_of, g = self._rows(inputs, N, norms.num_tokens or 0.0), f.state.global_step
        # the update's micro-batches, its earlier slices' included: TRL's _step advances by each
        f.current_gradient_accumulation_steps = last = update_micro_batches(counts, N, rows_each)
        done = f._micro_at[1] if acc.slices > 1 and f._micro_at[0] == g else 0
        try:
            for start in range(0, N, rows_each):
                rows = slice(start, min(start + rows_each, N))
                f._loss_call = (settings, norms, acc, inputs, rows, K)
                # accelerate's sync_gradients: True only on the update's last micro-batch (its accumulate context)
                f._micro_at, f.accelerator.sync_gradients = (g, done), done == last - 1
                batch = batch_of(rows)
                with CAPTURE_GUARD:  # as train/update.py: no default-generator draw beside a sampler's capture
                    with fw.amp():
                        # TRL's training step passes num_items_in_batch=None (the count is the batch dict's)
                        loss = _checked_loss(f.compute_loss(model, batch, num_items_in_batch=None))
                    if not scaled:  # transformers' training_step: a loss not scaled for accumulation is divided
                        loss = loss / last
                    loss = loss / K  # TRL's per-process loss; grpokit's summed gradients then are DDP's mean
                    loss.backward()
                acc.loss += loss.item()  # summed over processes: the mean of TRL's per-process losses, as it logs
                done += 1
                f._micro_at = (g, done)
        finally:
            f._loss_call, f.accelerator.sync_gradients = None, True


def _checked_loss(loss: Any) -> torch.Tensor:
    """compute_loss's result, or one sentence when it is not TRL's scalar tensor."""
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ConfigError(f"compute_loss returned {type(loss).__name__}; TRL's contract is a scalar tensor (the loss)")
    return loss


def compute_loss(facade: Any, model, inputs: dict[str, Any]):
    """grpokit.trl's own ``_compute_loss`` (what ``super()._compute_loss`` runs): the log-probabilities of
    the completion tokens by ``facade._get_per_token_logps_and_entropies`` (the subclass's when it
    overrides it), then grpokit's objective (algo/loss.py) with the update's loss settings and
    normalisers, so the micro-batches' losses add up to the update's (called directly: this batch's own).
    With K processes the result is on TRL's per-process scale: grpokit's share of the global loss (its
    normalisers count every process's rows) times K, as TRL's per-process mean (grpo, bnpo, dr_grpo, luspo:
    each process's rows are 1/K of the batch) and its dapo / cispo normaliser (num_items_in_batch / num_processes)
    are; TrlLoss divides by K again before back-propagating."""
    from grpokit.algo.loss import objective_loss
    from grpokit.algo.pipeline import loss_settings
    from grpokit.algo.settings import LossTensors
    from grpokit.train.update import add_loss_metrics, add_mismatch

    prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
    completion_mask = inputs["completion_mask"]
    logps, entropies, aux = facade._get_per_token_logps_and_entropies(
        model,
        torch.cat([prompt_ids, completion_ids], dim=1),
        torch.cat([inputs["prompt_mask"], completion_mask], dim=1),
        completion_ids.size(1),
        compute_entropy=True,
        compute_aux_loss=facade.aux_loss_enabled,
    )
    mask = completion_mask * inputs["tool_mask"] if "tool_mask" in inputs else completion_mask
    call = facade._loss_call
    if call is None:  # called directly: the configured objective over this batch alone
        (settings, norms), acc, update, rows, K = loss_settings(facade._get().cfg.algo), None, None, None, 1
    else:
        settings, norms, acc, update, rows, K = call
    cut = (lambda t: t[rows] if t is not None else None) if update is not None else (lambda t: None)  # noqa: E731
    old = inputs.get("old_per_token_logps")
    tensors = LossTensors(
        logps,
        old if old is not None else logps.detach(),
        inputs["advantages"],
        mask.to(logps.dtype),
        ref_logp=inputs.get("ref_per_token_logps"),
        entropy=entropies,
        ratio_mask=completion_mask.to(logps.dtype),
        turn_ids=cut(getattr(update, "turn_ids", None)),
        seq_weights=update.seq_weights(rows) if update is not None and update.seq_weights is not None else None,
        sampler_log_weight=cut(getattr(update, "sampler_log_weight", None)),
        policy_mask=cut(getattr(update, "policy_mask", None)),
        policy_weight=inputs.get("importance_sampling_ratio"),  # the batch's own, as TRL reads it
    )
    loss, metrics = objective_loss(tensors, settings, norms)
    if aux is not None:  # a Mixture-of-Experts router loss, each micro-batch weighed by its rows (as grpokit's loss)
        share = completion_ids.size(0) / (norms.num_sequences or completion_ids.size(0))
        loss = loss + facade.router_aux_loss_coef * share * aux
    loss = loss * K  # TRL's per-process scale (grpokit's share is 1/K of it); TrlLoss divides it back
    if acc is not None:  # the update's kl, clip_ratio/*, ... and entropy (over the loss mask: TRL's `mask`)
        add_loss_metrics(acc, metrics, entropies, mask, tensors.policy_mask)
        if update is not None:  # the sampler / trainer mismatch metrics, as grpokit's own micro-step
            add_mismatch(acc.mismatch, update, rows, tensors.old_logp, update.batch.rows(rows))
    return loss
