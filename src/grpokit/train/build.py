"""A config becomes a run: the one place where ``cfg`` turns into the run's objects.

``Trainer.__init__`` (train/loop.py) is a sequence of the builders below, in this order:

    settle_config   resolved, validated Config (own data replaces the task; the demo's settings)
    prepare_process threads, determinism, seeds
    build_inputs    tokenizer-side objects: the episode loop, training and held-out prompts
    build_rewards   the reward runner (training), the evaluator's runner, weights, process reward
    build_policy    model, reference model, autocast, data-parallel / FSDP placement, EOS ids
    build_optimizer optimizer, schedule, lambda-GRPO's learnable lambda, micro-batch token budget
    (the run's SamplingParams: rollout/sampling.py's sampling_params, shared with the evaluations)
    build_recorder  the metrics sinks (rank 0 only)

Each builder takes config sections and the objects built before it and returns records or plain
objects; none of them sees the Trainer. Rollout engines come from ``engines.make_engine``.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from grpokit.config.io import to_dict
from grpokit.config.judge import respelled_judge
from grpokit.config.sections import Config, ConfigError
from grpokit.data.prompts import PromptMaker
from grpokit.data.vision import has_images, load_processor
from grpokit.nn import kernels, vocab
from grpokit.nn.models import frozen_copy
from grpokit.record.recorder import NullRecorder, make_recorder
from grpokit.rewards.runner import RewardRunner
from grpokit.rollout import gec
from grpokit.validation import validate

from . import (
    distributed,
    domain_setup,
    episode_setup,
    liger,
    lora,
    model_options,
    models,
    reward_setup,
    run_data,
    stages,
    teacher,
)
from .distributed import DistContext
from .hidden_states import compile_backbone
from .models import eos_ids, load_model, model_path, resolve_dtype
from .update import make_optimizer
from .update_windows import run_updates

SMALL_MODEL = 20_000_000  # parameters; below this, train.threads=0 (auto) uses one CPU thread


def settle_config(cfg: Config, own_rows: bool) -> Config:
    """One's own data replaces the task; the demo fills what nobody set; "demo" becomes the task's
    checkpoint; then every section is validated."""
    cfg = stages.settle_stages(cfg)  # train.steps: the stages' sum (before the demo would fill it)
    domain_setup.refuse_beside_domains(cfg, own_rows)  # before resolve_run reads data.task and its task_params
    return validate(domain_setup.settle_domains(run_data.resolve_run(cfg, own_rows=own_rows)))


def check_rollout_func(cfg: Config, rollout_func: Callable | None, tools=None, environment_factory=None) -> None:
    """TRL's ``rollout_func`` samples each step's batch itself. Refused beside it, each in one sentence: an
    asynchronous sampler (its prefetched batches would be trained in the function's place, the function called
    only for refills), and tools or an environment (TRL runs its tool loop on the function's completions;
    grpokit's episode loop is stage 2, which the function replaces, so the tools would never be called)."""
    if rollout_func is None:
        return
    s = cfg.rollout.async_staleness
    if s > 0:
        raise ConfigError(
            f"a rollout_func samples every batch itself, so rollout.async_staleness={s} would train the "
            "asynchronous sampler's batches instead and call it only for refills; set rollout.async_staleness=0"
        )
    given = [
        what
        for what, on in (
            ("tools=", bool(tools)),
            ("environment_factory=", environment_factory is not None),
            (f"env.tools={cfg.env.tools}", bool(cfg.env.tools)),
            (f"env.environment={cfg.env.environment!r}", bool(cfg.env.environment)),
        )
        if on
    ]
    if given:
        raise ConfigError(
            f"a rollout_func samples every batch itself and grpokit does not run the tool loop on its completions "
            f"as TRL does, so {' and '.join(given)} would never be called; call the tools inside the rollout_func "
            "(its env_mask marks their tokens), or drop the rollout_func to let grpokit run the episodes"
        )


def prepare_process(t) -> None:
    """Threads, deterministic algorithms and every seed of the process (``t``: the train section)."""
    if t.threads:
        torch.set_num_threads(t.threads)
    if t.deterministic:  # cuBLAS refuses deterministic mode without a fixed workspace (read at its first use)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(t.deterministic)
    random.seed(t.seed)
    np.random.seed(t.seed)
    torch.manual_seed(t.seed)


@dataclass(frozen=True)
class Inputs:
    """What stage 1 hands the loop: the episode loop (tools, environment) and the prompts."""

    episodes: Any
    prompts: list
    eval_prompts: list
    make_prompts: PromptMaker  # rows -> prompts as the training rows became them (held-out sets, TRL's evaluate())


IMAGE_EPISODES = (
    "tools and environments with image prompts are not supported yet; drop env.tools / the environment or the image "
    "column"
)


def build_inputs(
    cfg: Config, tokenizer, train_rows, eval_rows, tools, environment_factory, given_tokenizer=None
) -> Inputs:
    """Rows (one's own or the task's), the episode loop, and the rows as chat-templated prompts (rows
    with images through the model's processor: ``given_tokenizer`` when it is one, as TRL passes it)."""
    if cfg.data.domains:  # every domain's rows, tagged (train/domain_setup.py)
        train_rows, eval_rows = domain_setup.domain_rows(cfg)
    else:
        train_rows, eval_rows = run_data.data_rows(cfg, train_rows, eval_rows)
        run_data.check_gold_answers(cfg, train_rows)
        run_data.check_gold_answers(cfg, eval_rows, held_out=True)  # after eval_size: the rows evaluated
    run_data.refuse_idle_evaluation(cfg, eval_rows)
    if (tools or environment_factory or cfg.env.tools or cfg.env.environment) and has_images(train_rows):
        raise ConfigError(IMAGE_EPISODES)  # before the episodes' own checks (a tool format): none would help
    episodes = episode_setup.episode_runner(cfg, tokenizer, tools, environment_factory, run_data.task_of(cfg))
    # chat templates show the tools in the prompt (each row its environment's)
    make_prompts = prompt_maker(cfg, tokenizer, episodes.row_schemas, given_tokenizer)
    prompts = make_prompts(train_rows, "the training rows")
    if (
        episodes.multi_turn and prompts and prompts[0].vision is not None
    ):  # tag-format tools and environments show no schema
        raise ConfigError(IMAGE_EPISODES)
    return Inputs(episodes, prompts, make_prompts(eval_rows, "the held-out rows"), make_prompts)


def prompt_maker(cfg: Config, tokenizer, tools, given_tokenizer=None) -> PromptMaker:
    """The one way rows become prompts in a run (data/prompts.py PromptMaker), with the model's
    processor: ``given_tokenizer`` when it is one (TRL's processing_class), else the model's own
    (None for a text model)."""
    processor = load_processor(model_path(cfg.model.name_or_path), given_tokenizer, cfg.model.trust_remote_code)
    return PromptMaker(tokenizer, cfg.data, tools, processor)


@dataclass(frozen=True)
class Rewards:
    """Stage 3's objects: the training runner, the evaluator's runner, each function's weight, and
    the process reward (``reward.process_function``, which only ``algo.advantage=process`` accepts;
    None otherwise)."""

    runner: RewardRunner
    eval_runner: RewardRunner
    weights: list[float]
    process_fn: Callable | None
    domain_eval: dict[str, RewardRunner]  # each domain's held-out verifier (data.domains; {} without)
    domain_graders: dict[str, str]  # each domain's grader column among the training rewards (domain/<d>/accuracy)
    judged: list[int] | None  # reward.judge: the columns whose sum says a completion is right (None: the total)


def build_rewards(cfg: Config, reward_funcs, episodes) -> Rewards:
    if cfg.data.domains:  # each domain's functions, scoring only its own groups
        specs = domain_setup.domain_reward_specs(cfg, reward_funcs)
    else:
        specs = reward_setup.reward_specs(cfg, reward_funcs, episodes.factory)  # one factory or named ones
    process_fn = reward_setup.process_function(cfg) if cfg.reward.process_function else None
    if process_fn is not None and len(specs) > 1:  # reward_funcs or data.domains: validation saw only the config
        raise ConfigError(
            f"algo.advantage=process trains on reward.process_function's step rewards alone, so {len(specs)} outcome "
            f"reward functions ({', '.join(sp.name for sp in specs)}) would leave all but the logged one unread; "
            "give one"
        )
    rc = cfg.reward
    runner = RewardRunner(
        specs,
        num_workers=rc.num_workers,
        timeout_s=rc.timeout_s,
        failure_value=rc.failure_value,
        max_failure_fraction=rc.max_failure_fraction,
        convention=rc.convention,
    )
    graders = domain_setup.domain_graders(cfg)  # one grader per domain, for the held-out set and each step
    domain_setup.warn_unjudged(cfg, specs)
    if (respelled := respelled_judge(cfg)) is not None:  # an earlier run's judge now reaches more readers
        print(f"grpokit: warning: {respelled}", flush=True)
    return Rewards(
        runner,
        reward_setup.eval_runner(cfg, runner),
        [sp.weight for sp in specs],
        process_fn,
        domain_setup.domain_eval_runners(graders, rc.convention),
        domain_setup.training_graders(graders),
        domain_setup.judged_columns(cfg, specs),
    )


@dataclass(frozen=True)
class Policy:
    """The model side of the run: policy, frozen reference (None without KL, or under LoRA where
    the reference is the base with adapters disabled, or the adapter the run started from:
    ``ref_adapter``), the forward's autocast and the EOS ids."""

    model: Any
    ref_model: Any
    autocast: Callable
    eos: set[int]
    router_aux: float = 0.0  # weight of a Mixture-of-Experts router loss in the update (0: none; model_options.py)
    ref_adapter: lora.StartingAdapter | None = None  # LoRA from a trained adapter: the KL reference (lora.py)


def build_policy(cfg: Config, device: torch.device, dist: DistContext, tokenizer, model=None) -> Policy:
    t, m = cfg.train, cfg.model
    model = load_model(m, device, resolve_dtype(m, device), model)
    if m.disable_dropout and model_options.disable_dropout(model) and dist.is_main:  # before the reference copy
        print("grpokit: the policy's dropout is off (model.disable_dropout=true)", flush=True)
    if not t.threads and device.type == "cpu" and sum(p.numel() for p in model.parameters()) < SMALL_MODEL:
        torch.set_num_threads(1)  # auto: tiny matmuls are overhead-bound; threads only add contention
    if kernels.wants_onednn(m.cpu_matmul, device) and not m.compile:  # float32 linears through oneDNN (nn/kernels.py);
        # not under torch.compile, whose inductor cannot lower those calls (it compiles the plain linears itself)
        kernels.use_onednn_linears(model)
    if liger.apply_kernels(m.kernels, model, device) and dist.is_main:  # before the reference copy: it has them too
        print(f"grpokit: kernels: liger-kernel's RMSNorm, SwiGLU and RoPE (model.kernels={m.kernels})", flush=True)
    if m.lm_head_fp32:  # ScaleRL: after oneDNN, whose binding would replace the head's float32 forward
        model_options.head_in_float32(model)
    on = vocab.wanted(m.vocab_kernels, device)
    vocab.mark(model, on)  # before the reference copy: it is marked too
    if on and dist.is_main:
        print(
            f"grpokit: kernels: grpokit's Triton draw and output-layer passes (model.vocab_kernels={m.vocab_kernels})"
        )
    if cfg.algo.distill_teacher:  # on-policy distillation: the teacher holds the reference's place (train/teacher.py)
        ref_model = teacher.load_teacher(cfg, device, resolve_dtype(m, device), tokenizer)
    else:
        ref_model = frozen_copy(model) if cfg.algo.beta > 0 and not m.lora_rank else None
    if m.neftune_noise_alpha:  # after the copy: a separate reference gets no noise, as TRL's
        model_options.add_neftune(model, m.neftune_noise_alpha)
    autocast = models.autocast_factory(m, device, model)
    dist.broadcast_params(model)
    if t.fsdp:
        distributed.fully_shard_model(model)
    if m.compile and not compile_backbone(model, m.compile_backend, m.compile_mode):
        raise ConfigError(
            f"model.compile=true compiles the backbone of grpokit's log-probability passes, but {m.name_or_path!r} "
            "has none apart from its head (soft-capped logits or no get_decoder); set model.compile=false"
        )
    # LoRA from a trained adapter (a PeftModel given as the model): the KL reference is that adapter, not the base
    keep_start = ref_model is None and cfg.algo.beta > 0 and m.lora_rank > 0 and not lora.at_base(model)
    return Policy(
        model,
        ref_model,
        autocast,
        eos_ids(tokenizer, model),
        model_options.router_coefficient(model, m.router_aux_loss_coef),
        lora.StartingAdapter(model) if keep_start else None,
    )


@dataclass(frozen=True)
class Optimization:
    """Stage 6's objects: optimizer and schedule (the micro-batch token budget comes with the memory
    plan, memory_plan.py; a stage's own optimizer, lambda-GRPO's, with its state, algo/stage_state.py)."""

    optimizer: torch.optim.Optimizer
    scheduler: Any


def build_optimizer(cfg: Config, model) -> Optimization:
    t, a = cfg.train, cfg.algo
    optimizer, scheduler = make_optimizer(model, cfg.optim, run_updates(t.steps, t, a.num_iterations))
    return Optimization(optimizer=optimizer, scheduler=scheduler)


def error_correction_renderer(cfg: Config):
    """EDGE-GRPO's guided error correction renderer (None when algo.error_correction=off)."""
    return gec.resolve_renderer(cfg.algo.error_correction_fn) if cfg.algo.error_correction != "off" else None


def build_recorder(cfg: Config, run_dir: Path, dist: DistContext, quiet: bool, resume_step: int | None):
    """The run's metrics sinks on rank 0 (console left out when ``quiet``); a no-op elsewhere."""
    if not dist.is_main:
        return NullRecorder()
    r = cfg.record
    return make_recorder(
        run_dir,
        [s for s in r.sinks if not (quiet and s == "console")],
        cfg.train.steps,
        to_dict(cfg),
        health=cfg.health,
        resume_step=resume_step,
        samples_every=r.samples_every,
        samples_prompts=r.samples_prompts,
        console_every=r.console_every,
        run_name=r.run_name or None,
        project=r.project or None,
    )
