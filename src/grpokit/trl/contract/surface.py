"""Attributes and helpers of TRL's GRPOTrainer that scripts and TRL's own tests read.

Kept apart from trainer.py: each is small and answers what a TRL user inspects, from grpokit's
state: ``_logs`` (the recent completions with their rewards, TRL's rolling log), the entropy and
off-policy masks as TRL's methods compute them, and the reward functions' names and weights.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

import torch

from grpokit.config.sections import ConfigError
from grpokit.rewards.inputs import reward_prompts
from grpokit.rewards.spec import reward_name
from grpokit.train import distributed

from ..args.model import fp16_on_cpu


def new_logs(maxlen: int | None = None) -> dict[str, Any]:
    """TRL's ``_logs``: rolling columns of the latest sampled completions (``prompt``, ``completion``,
    ``rewards`` per function, ``advantages``, ``extra`` per ``log_extra`` column, ``images``)."""
    return {
        "prompt": deque(maxlen=maxlen),
        "completion": deque(maxlen=maxlen),
        "images": deque(maxlen=maxlen),
        "rewards": defaultdict(lambda: deque(maxlen=maxlen)),
        "advantages": deque(maxlen=maxlen),
        "extra": defaultdict(lambda: deque(maxlen=maxlen)),
    }


def add_to_logs(logs: dict[str, Any], batch: Any, advantages_N: torch.Tensor) -> None:
    """Append one scored batch (``types.ScoredBatch``) and the advantages it trains on (``advantages_N``, one
    per completion, as TRL logs the advantages it computed): one entry per completion."""
    G = batch.group_size
    logs["prompt"].extend(reward_prompts(batch.prompts, G, "grpokit", batch.rollout.episodes))
    logs["completion"].extend(batch.texts)
    for j, name in enumerate(batch.names):
        logs["rewards"][name].extend(batch.rewards_NF[:, j].tolist())
    logs["advantages"].extend(advantages_N.tolist())
    for column, values in batch.extra.items():
        logs["extra"][column].extend(values)


def high_entropy_mask(entropy_NT: torch.Tensor, mask_NT: torch.Tensor, quantile: float) -> torch.Tensor:
    """TRL's ``get_high_entropy_mask``: boolean, True on a real token whose entropy is at or above the
    ``quantile`` quantile of the real tokens' entropies (quantile 1.0 keeps the maximum only, 0.0
    every real token); all False when no token is real."""
    real = mask_NT.bool()
    if not real.any():
        return torch.zeros_like(real)
    threshold = torch.quantile(entropy_NT[real].float(), quantile)
    return (entropy_NT >= threshold) & real


def reward_names(funcs: list) -> list[str]:
    """TRL's ``reward_func_names``: each function's one name (rewards/spec.py ``reward_name``, the name its
    metrics and ``_logs`` column carry), a reward model's folder or id's last part."""
    return [reward_name(f) for f in funcs]


class Accelerator:
    """What TRL's code and its helpers ask of accelerate's ``Accelerator``: where this process stands in
    the job (from torch.distributed once joined, else torchrun's RANK / LOCAL_RANK / WORLD_SIZE), the
    device, ``gather`` / ``gather_for_metrics`` / ``reduce`` over processes, ``state``, ``autocast``,
    ``backward``, ``prepare`` (an extra model to the device), a print on the main process only, a
    barrier, and the end of the process group.
    ``device_of()`` is the run's device (the trainer's, once built)."""

    def __init__(self, device_of: Any = None):
        self._device_of = device_of or (lambda: torch.device("cuda" if torch.cuda.is_available() else "cpu"))

    device = property(lambda self: torch.device(self._device_of()))
    # accelerate's: False inside an update's micro-batches before its last (set by stages.TrlLoss around a
    # subclass's compute_loss), True otherwise
    sync_gradients = True
    gradient_accumulation_steps = 1

    @property
    def distributed_type(self) -> Any:
        from accelerate.utils import DistributedType

        return DistributedType.MULTI_GPU if self.num_processes > 1 else DistributedType.NO

    @property
    def state(self) -> Any:
        """accelerate's state as TRL's helpers read it (no DeepSpeed, no FSDP plugin)."""
        from types import SimpleNamespace

        return SimpleNamespace(
            process_index=self.process_index,
            local_process_index=self.local_process_index,
            num_processes=self.num_processes,
            is_main_process=self.is_main_process,
            device=self.device,
            distributed_type=self.distributed_type,
            deepspeed_plugin=None,
            fsdp_plugin=None,
            mixed_precision="no",
        )

    def gather(self, tensor: Any) -> Any:
        """Every process's ``tensor`` concatenated along dim 0 (a 0-d tensor becomes one row each)."""
        import torch.distributed as dist

        t = tensor if tensor.dim() else tensor[None]
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return t
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts)

    gather_for_metrics = gather

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        import torch.distributed as dist

        out = tensor.clone() * scale
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(out)
            if reduction == "mean":
                out /= dist.get_world_size()
        return out

    def autocast(self, *args: Any, **kwargs: Any) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def backward(self, loss: Any, **kwargs: Any) -> None:
        loss.backward(**kwargs)

    process_index = property(lambda self: distributed.position()[0])
    num_processes = property(lambda self: distributed.position()[1])
    local_process_index = property(lambda self: distributed.position()[2])
    is_main_process = property(lambda self: self.process_index == 0)
    is_local_main_process = property(lambda self: self.local_process_index == 0)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self.is_local_main_process:
            print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def end_training(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def unwrap_model(self, model: Any, **kwargs: Any) -> Any:
        return model

    def prepare(self, *objects: Any, device_placement: Any = None) -> Any:
        """accelerate's ``prepare`` as a subclass uses it on an extra model (a teacher, a reference): a module
        moved to the run's device (grpokit runs the policy's distribution itself; an extra model is
        evaluated, not trained, so it needs no wrapper); anything else returned as given."""
        out = tuple(o.to(self.device) if isinstance(o, torch.nn.Module) else o for o in objects)
        return out[0] if len(out) == 1 else out


def warn_like_trl(args: Any) -> None:
    """The warnings TRL's GRPOTrainer gives at construction about a setting that works but is likely a mistake."""
    import logging

    if args.importance_sampling_level == "sequence" and args.loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
        logging.getLogger("grpokit.trl").warning(
            "importance_sampling_level='sequence' with loss_type=%r: this loss adds up per-token terms, which weights "
            "each sequence by its completion length rather than following GSPO's per-sequence objective; "
            "loss_type='grpo' is GSPO's setting",
            args.loss_type,
        )
    if fp16_on_cpu(args):
        logging.getLogger("grpokit.trl").warning(
            "fp16=True on the CPU: mixed precision is off and the run trains in float32, as TRL/accelerate do"
        )
    if args.use_transformers_paged:  # TRL 1.16's FutureWarning, and the alias takes effect
        import warnings

        warnings.warn(
            "`use_transformers_paged` is deprecated and will be removed in v2.0.0. Use "
            "`use_transformers_continuous_batching` instead.",
            FutureWarning,
            stacklevel=3,
        )
        args.use_transformers_continuous_batching = True
    check_continuous_batching(args.transformers_continuous_batching_config)
    if args.vllm_importance_sampling_cap is not None:  # TRL 1.16 gives a FutureWarning and copies it to clip_max
        logging.getLogger("grpokit.trl").warning(
            "vllm_importance_sampling_cap is deprecated (TRL 1.16); its value %s replaces "
            "vllm_importance_sampling_clip_max, "
            "use that argument instead",
            args.vllm_importance_sampling_cap,
        )


def check_continuous_batching(config: Any) -> None:
    """transformers_continuous_batching_config: keywords of transformers' ContinuousBatchingConfig, refused
    in one sentence when transformers would refuse them (TRL builds one from them)."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise ConfigError(
            f"GRPOConfig argument transformers_continuous_batching_config={config!r} is not valid; use None "
            "or a dict of transformers' ContinuousBatchingConfig keywords"
        )
    try:
        from transformers.generation import ContinuousBatchingConfig
    except ImportError:  # an older transformers: nothing to check against
        return
    try:
        ContinuousBatchingConfig(**config)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"GRPOConfig argument transformers_continuous_batching_config={config!r} is not valid: {e}"
        ) from None


def refuse_vision_continuous_batching(args: Any, model: Any, processing_class: Any, trust_remote_code: bool) -> None:
    """TRL refuses continuous batching for a multimodal model (its engine takes token ids only); TRL's words."""
    if not args.use_transformers_continuous_batching:
        return
    from grpokit.data.vision import is_processor, load_processor

    if processing_class is not None:
        multimodal = is_processor(processing_class)
    elif isinstance(model, str):
        multimodal = load_processor(model, None, trust_remote_code) is not None
    else:
        multimodal = hasattr(getattr(model, "config", None), "vision_config")
    if multimodal:
        raise ConfigError(
            "`use_transformers_continuous_batching` does not support multimodal models. Use `use_vllm` instead."
        )


def set_log_level(args: Any, main: bool) -> None:
    """transformers' log_level (main process) and log_level_replica (the others) as its verbosity; passive leaves it."""
    from transformers.training_args import trainer_log_levels
    from transformers.utils import logging as hf_logging

    level = args.log_level if main else args.log_level_replica
    if level != "passive":  # "detail" is transformers' name for DEBUG
        hf_logging.set_verbosity(trainer_log_levels[level])


def _controller(facade: Any):
    """The adaptive entropy controller of the run (None: the coefficient is static or no run is built yet)."""
    trainer = facade._trainer
    return trainer.stage_state("entropy_control") if trainer is not None else None


def entropy_coef_of(facade: Any) -> float:
    """TRL's ``trainer.entropy_coef``: the adaptive controller's current coefficient, else the static one."""
    controller = _controller(facade)
    return controller.coef if controller is not None else facade.cfg.algo.entropy_coef


def set_entropy_coef(facade: Any, value: float) -> None:
    """Setting ``trainer.entropy_coef`` changes the coefficient the next steps use, as on TRL's trainer."""
    from grpokit.config.io import set_field

    controller = _controller(facade)
    if controller is not None:
        controller.coef = float(value)
    for cfg in {id(c): c for c in (facade.cfg, getattr(facade._trainer, "cfg", None)) if c is not None}.values():
        set_field(cfg, "algo.entropy_coef", float(value))


def last_world_entropy(facade: Any) -> float:
    """TRL's ``_last_world_entropy``: the entropy adaptive control measured last (inf before the first step)."""
    controller = _controller(facade)
    return controller.last_entropy if controller is not None else float("inf")


def per_token_logps_and_entropies(
    facade: Any,
    model,
    input_ids,
    attention_mask,
    logits_to_keep: int,
    batch_size=None,
    compute_entropy: bool = False,
    compute_aux_loss: bool = False,
    **vision: Any,
):
    """TRL's ``_get_per_token_logps_and_entropies`` on text inputs: ``(logps, entropies or None, aux_loss
    or None)`` of the last ``logits_to_keep`` tokens, logits divided by the temperature; the entropies
    carry gradient only while the entropy bonus is on (``_entropy_bonus_enabled``), as TRL's."""
    if any(v is not None for v in vision.values()):
        raise ValueError("_get_per_token_logps_and_entropies takes text inputs only under grpokit.trl")
    rows = batch_size or input_ids.shape[0]
    logps, ents, aux = [], [], []
    for s in range(0, input_ids.shape[0], rows):
        extra = {"output_router_logits": True} if compute_aux_loss else {}
        mask = attention_mask[s : s + rows]
        out = model(  # positions counted from each row's first real token, as the sampler and pi_old saw them
            input_ids=input_ids[s : s + rows],
            attention_mask=mask,
            position_ids=(mask.long().cumsum(dim=1) - 1).clamp(min=0),
            logits_to_keep=logits_to_keep + 1,
            **extra,
        )
        logp_all = torch.log_softmax(out.logits[:, :-1].float() / facade.args.temperature, dim=-1)
        logps.append(logp_all.gather(-1, input_ids[s : s + rows, -logits_to_keep:, None])[..., 0])
        src = logp_all if facade._entropy_bonus_enabled else logp_all.detach()
        ents.append(-(src.exp() * src).sum(dim=-1))
        aux += [out.aux_loss] if compute_aux_loss else []
    return torch.cat(logps), (torch.cat(ents) if compute_entropy else None), (torch.stack(aux).mean() if aux else None)


def accelerate_like_trl(args: Any, train_dataset: Any, eval_dataset: Any) -> None:
    """``args.accelerator_config`` as TRL holds it after construction (transformers' ``AcceleratorConfig``),
    and TRL's settings for streamed data: ``dispatch_batches`` False (True is refused, as TRL refuses it)
    and no DataLoader workers for a streamed train set. Neither changes grpokit's run (it has no DataLoader);
    they keep what a script reads from ``args`` the same as under TRL."""
    import logging

    from transformers.trainer_pt_utils import AcceleratorConfig

    value = args.accelerator_config
    if not isinstance(value, AcceleratorConfig):
        args.accelerator_config = AcceleratorConfig(**(value or {}))
    evals = eval_dataset.values() if isinstance(eval_dataset, dict) else [eval_dataset]  # a DatasetDict is a dict
    if _streamed(train_dataset) or any(_streamed(d) for d in evals):
        if args.accelerator_config.dispatch_batches:  # TRL's words: scripts and TRL's tests match on them
            raise ConfigError(
                "Iterable datasets require `dispatch_batches=False`, but accelerator_config.dispatch_batches is True; "
                "set it to False"
            )
        args.accelerator_config.dispatch_batches = False
    if _streamed(train_dataset) and args.dataloader_num_workers != 0:
        logging.getLogger("grpokit.trl").warning(
            "Iterable datasets require dataloader_num_workers=0 to keep each prompt's group together; "
            "overriding %d, as TRL does",
            args.dataloader_num_workers,
        )
        args.dataloader_num_workers = 0


def _streamed(dataset: Any) -> bool:
    return type(dataset).__name__ == "IterableDataset"
