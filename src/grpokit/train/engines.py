"""The rollout engine of a run (rollout.backend, rollout.async_staleness), the model it samples
with, and where the next prompts come from. Each function takes the few objects it needs, never
the Trainer, so an engine can be built and tested without one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from pathlib import Path
from typing import Callable

import torch

from grpokit.algo.ratio import inert_at_ratio_one
from grpokit.algo.tis import has_sampler_mismatch
from grpokit.config.base import ConfigError
from grpokit.config.sections import Config, RolloutConfig
from grpokit.rollout.cards import missing_card
from grpokit.rollout.collect import first_group_size
from grpokit.rollout.engine import HFEngine, RolloutEngine
from grpokit.rollout.lockstep import lockstep

from . import lora
from .distributed import DistContext, rank_seed
from .liger import apply_kernels
from .models import model_path

log = logging.getLogger("grpokit.train")


def uses_tis(cfg: Config) -> bool:
    """TIS applies when the sampler is not the trainer's own forward: vLLM, or stale async samples."""
    r = cfg.rollout
    return r.tis_cap > 0 and has_sampler_mismatch(r.backend, r.async_staleness)


def sampling_model(model, dist: DistContext):
    """A context giving the model to sample with: the model itself, or under FSDP a stand-in that
    keeps every rank's forward passes in step (rollout/lockstep.py says why)."""
    if not dist.fsdp:
        return contextlib.nullcontext(model)
    return lockstep(model, dist.any_rank)


def next_prompts(engine: RolloutEngine, sampler, dist: DistContext, n: int, group_size: int):
    """``(prompts, rollout or None)``: the engine's prefetch, or this rank's slice of the next prompts."""
    got = engine.prefetched(n, group_size)
    if got is not None:
        return got
    k, w = dist.rank, dist.world_size
    return sampler.next_batch(n * w)[k * n : (k + 1) * n], None  # same draw on every rank


def hf_engine(
    cfg: Config, eos_token_ids: set[int], pad_token_id: int, decode: Callable, generator: torch.Generator
) -> HFEngine:
    """The engine sampling on the trainer's own model (rollout.engine picks its decoder). CUDA graphs
    are off with NEFTune: a graph would replay one noise draw."""
    r = cfg.rollout
    return HFEngine(
        eos_token_ids=eos_token_ids,
        pad_token_id=pad_token_id,
        decode=decode,
        generator=generator,
        decoder=r.engine,
        generation_kwargs=r.generation_kwargs,
        cuda_graphs=r.cuda_graphs and not cfg.model.neftune_noise_alpha,
    )


def refuse_vllm_tied_adapter(cfg: Config, model) -> None:
    """vLLM computes a tied model's head from its embedding weight (it loads no lm_head of its own), so a LoRA
    adapter on either end, which makes the trained policy's two ends differ, cannot be sampled there."""
    backend = cfg.rollout.backend
    if backend in ("vllm", "vllm_server") and cfg.model.lora_rank and lora.tied_and_adapted(model):
        raise ConfigError(
            f"rollout.backend={backend} with tied embeddings (tie_word_embeddings) and a LoRA adapter on lm_head "
            "or embed_tokens is not supported: vLLM computes the head from the embedding weight, so it would sample "
            "from another policy than the one trained; leave lm_head and embed_tokens out of "
            "model.lora_target_modules or use rollout.backend=hf"
        )


def make_engine(
    cfg: Config,
    model,
    step: int,
    params,
    device: torch.device,
    dist: DistContext,
    run_dir: Path,
    hf: HFEngine,
    async_source: tuple[Callable, Callable] | None = None,
    async_state: dict | None = None,
    tokenizer=None,
) -> RolloutEngine:
    """The rollout engine for ``rollout.backend`` / ``rollout.async_staleness`` (``hf``, sampling on
    the trainer's model, when neither asks for another), holding the policy ``model`` after ``step``
    updates. ``async_source`` is ``(sample, next_batch)`` for the async sampler (rollout/async_.py
    says what each does); ``async_state`` is what a resumed checkpoint kept of the async sampler;
    ``tokenizer`` decodes stop strings in rollout worker processes."""
    r = cfg.rollout
    refuse_vllm_tied_adapter(cfg, model)
    if r.backend == "vllm_server":
        from grpokit.data.vision import image_token_id
        from grpokit.rollout.vllm_client import make_server_engine

        engine = make_server_engine(
            r, params, run_dir, dist, lora=bool(cfg.model.lora_rank), image_token_id=image_token_id(model)
        )
        engine.after_update(model, step)  # the server starts from the base checkpoint: push the policy once
        return engine
    if r.backend == "vllm":
        engine = colocated_engine(cfg, params, device, dist)
        if step:  # resumed: the engine loaded the base checkpoint, the policy has moved on
            engine.after_update(model, step)
        return engine
    workers = r.async_workers + r.async_remote_workers
    if r.async_staleness > 0 and workers > 0:
        local = worker_device(r, device, dist.world_size) if r.async_workers else None
        if local == device:  # the local workers share the trainer's cores or card
            warn_shared_device_async(r.async_staleness, device, workers=True)
        return process_engine(cfg, model, step, params, hf, async_source[1], async_state, tokenizer, dist, local)
    if r.async_staleness > 0:  # the sampler thread shares the trainer's device
        warn_shared_device_async(r.async_staleness, device)
    if r.async_staleness > 0:
        from grpokit.rollout.async_ import AsyncRollout

        sample, next_batch = async_source
        return AsyncRollout(
            model,
            step,
            sample,
            next_batch,
            hf=hf,
            prompts_per_step=cfg.train.prompts_per_step,
            group_size=prefetch_group_size(r),
            max_staleness=r.async_staleness,
            device=device,
            resume_state=async_state,
            partial_tokens=r.async_partial_tokens,
            timeout_s=r.async_timeout_s,
            **async_ranks(cfg, dist),
        )
    return hf


def prefetch_group_size(r: RolloutConfig) -> int:
    """Completions per prompt of the batches an asynchronous sampler prefetches: those of a step's first
    batch (rollout/collect.py), or the trainer would never take them and sample every step itself."""
    return first_group_size(r.group_size, r.sample_group_size, r.gfpo_adaptive)


def worker_device(r: RolloutConfig, device: torch.device, world_size: int) -> torch.device:
    """Where the local rollout workers sample (rollout.async_worker_device): the trainer's ``device`` when unset;
    a card this process cannot use is refused in one sentence, as is a fixed card shared by several ranks."""
    d = r.async_worker_device
    if not d:
        return device
    name = f"rollout.async_worker_device={d}"
    if world_size > 1 and ":" in d:
        raise ConfigError(
            f'{name} would put every one of the {world_size} ranks\' workers on that card; leave it "" (each '
            f"rank's own card), or start `grpokit rollout-worker --device {d}` workers (rollout.async_remote_workers)"
        )
    why = missing_card(d)
    if why:
        raise ConfigError(f'{name} but {why}; use cpu or "" (the trainer\'s device)')
    return torch.device("cuda", torch.cuda.current_device()) if d == "cuda" else torch.device(d)


def split_cpu_threads(threads: int, workers: int) -> tuple[int, int]:
    """(the trainer's, each worker's) intra-op threads when ``workers`` rollout processes share the trainer's
    ``threads``: an even share each, at least one, so that together they run no more threads than ``threads``
    where the share allows (rollout.async_worker_threads)."""
    each = max(1, threads // (workers + 1))
    return max(1, threads - workers * each), each


def warn_ratio_one(cfg: Config) -> None:
    """Once at the start: the ratio's settings a run gives that cannot act with one update per sampled batch."""
    inert = inert_at_ratio_one(cfg.algo, cfg.train.updates_per_batch)
    if inert:
        log.warning(
            "%s change nothing in this run: with one update per sampled batch (algo.num_iterations=1, "
            "train.updates_per_batch=1) the importance ratio is exactly 1 at every update; set "
            "train.updates_per_batch > 1 (several updates per sampled batch, as PPO trains) or "
            "algo.num_iterations > 1 for them to act",
            ", ".join(inert),
        )


def warn_shared_device_async(staleness: int, device: torch.device, workers: bool = False) -> None:
    """Asynchronous sampling on the trainer's own device runs, but was measured slower than synchronous
    there: say so once, with the measurement (bench/RESULTS.md). ``workers``: worker processes sample there,
    not the thread."""
    if device.type == "cuda" and workers:
        log.warning(
            "rollout.async_workers sample on the trainer's own %s beside the update: the processes take turns on "
            "the card, which no card has measured against synchronous rollout (bench/RESULTS.md); give them a card "
            "of their own (rollout.async_worker_device=cuda:N), or compare with rollout.async_staleness=0",
            device,
        )
        return
    if device.type == "cpu":
        log.warning(
            "rollout.async_staleness=%d samples on the same CPU cores the update uses: the two take turns on them, "
            "so a step is slower than synchronous, not faster (SmolLM2 on 2 cores, three seeds: 0.91x sync's trained "
            "tokens per second at staleness 1, 0.87x at 2; bench/RESULTS.md); asynchronous rollout pays when the "
            "sampler has its own device (rollout.backend=vllm_server); rollout.async_staleness=0 is the faster "
            "choice here",
            staleness,
        )
        return
    log.warning(
        "rollout.async_staleness=%d samples in a thread on the trainer's own %s device, beside the update on the "
        "same card: the two take turns on it, and a step is no faster than synchronous (a Qwen2.5-0.5B shape on an "
        "H200, staleness 1, the thread replaying CUDA graphs on its own stream: 5.5-5.7 s a step against 5.2-5.4; "
        "bench/RESULTS.md); give the sampler its own device (rollout.backend=vllm_server, or "
        "rollout.async_workers with rollout.async_worker_device=cuda:N), or set rollout.async_staleness=0",
        staleness,
        device.type,
    )


def async_ranks(cfg: Config, dist: DistContext) -> dict:
    """What an async sampler needs of this rank: its seed (as its synchronous sampling generator's), its
    slice of the global prompts, and a wait for the other ranks' batches."""
    return dict(
        seed=rank_seed(cfg.train.seed, dist.rank), rank=dist.rank, world_size=dist.world_size, wait_ranks=dist.barrier
    )


def process_engine(
    cfg: Config,
    model,
    step: int,
    params,
    hf: HFEngine,
    next_batch,
    state,
    tokenizer,
    dist: DistContext,
    device: torch.device | None,
):
    """``rollout.async_workers`` worker processes on ``device`` (None: only remote ones) sampling the async
    schedule (rollout/async_process.py)."""
    from grpokit.rollout.async_process import ProcessRollout, SampleContext

    r = cfg.rollout
    n = torch.get_num_threads()
    if r.async_worker_threads or device is None or device.type != "cpu":  # a card samples: one thread each
        trainer_threads, worker_threads = n, r.async_worker_threads or 1
    else:
        trainer_threads, worker_threads = split_cpu_threads(n, r.async_workers)
    if trainer_threads != n and r.async_workers:
        log.info(
            "rollout.async_workers=%d: the trainer's %d CPU threads split, %d for the trainer and %d per worker "
            "(rollout.async_worker_threads)",
            r.async_workers,
            n,
            trainer_threads,
            worker_threads,
        )
        torch.set_num_threads(trainer_threads)
    context = SampleContext(
        group_size=prefetch_group_size(r),
        params=params,
        eos_token_ids=frozenset(hf.eos_token_ids),
        pad_token_id=hf.pad_token_id,
        decoder=r.engine,
        tokenizer=tokenizer if params.stop else None,
        partial_tokens=r.async_partial_tokens,
        cuda_graphs=hf.cuda_graphs,
    )
    return ProcessRollout(
        model,
        step,
        next_batch,
        hf=hf,
        context=context,
        workers=r.async_workers,
        device=device or torch.device("cpu"),
        kernels=functools.partial(apply_kernels, "auto"),
        threads=worker_threads,
        timeout_s=r.async_timeout_s,
        on_fault=r.async_worker_fault,
        prompts_per_step=cfg.train.prompts_per_step,
        max_staleness=r.async_staleness,
        resume_state=state,
        **remote_workers(r, dist.rank),
        **async_ranks(cfg, dist),
    )


def remote_workers(r: RolloutConfig, rank: int) -> dict:
    """ProcessRollout's remote workers (rollout.async_remote_workers): how many, where this rank listens
    (rollout.async_listen's port + rank) and the key."""
    if not r.async_remote_workers:
        return {}
    from grpokit.rollout.async_remote import RemoteWorkers, parse_address, rollout_key

    host, port = parse_address(r.async_listen, "rollout.async_listen")
    return dict(remote=RemoteWorkers(r.async_remote_workers, (host, port + rank), rollout_key()))


def colocated_engine(cfg: Config, params, device: torch.device, dist: DistContext):
    """``rollout.backend=vllm``: one engine per rank, or one per group of ``rollout.vllm_tensor_parallel_size``
    ranks (rollout/vllm_tp.py). Its seed is the group's, as TRL's (the shards of an engine must sample the same
    tokens), mixed as the hf engine's rank seeds: group 0 (and so a one-process run) keeps the plain seed."""
    r = cfg.rollout
    seed = rank_seed(cfg.train.seed, dist.rank // r.vllm_tensor_parallel_size)
    m = dataclasses.replace(cfg.model, name_or_path=model_path(cfg.model.name_or_path))  # "demo" -> its folder
    if r.vllm_tensor_parallel_size > 1:
        from grpokit.rollout.vllm_tp import make_tensor_parallel_engine

        return make_tensor_parallel_engine(r, m, params, device, seed, dist)
    from grpokit.rollout.vllm import make_colocated_engine

    return make_colocated_engine(r, m, params, device, seed)
