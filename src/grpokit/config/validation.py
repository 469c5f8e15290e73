"""Validation of a whole config before any work starts.

``validate`` checks every value that can be checked without loading anything and raises
``ConfigError`` with one sentence naming the field, the value and what would be valid. Checks that
need data (a missing column) happen where the data is loaded, still before the first step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from grpokit.algo import estimators  # noqa: F401  (registers the built-in stages)
from grpokit.algo.advantages import BASELINES, SCALES, STD_KINDS
from grpokit.algo.loss import AGGREGATIONS, ENTROPY_AGGREGATIONS, KL_ESTIMATORS, RATIO_LEVELS
from grpokit.algo.pipeline import KL_PLACEMENTS
from grpokit.algo.registry import STAGE_SPECS, is_import_path, lookup, objective_spec, registered
from grpokit.algo.tis import TIS_MODES
from grpokit.rollout.gec import MODES as GEC_MODES
from grpokit.train.kernels import MODES as CPU_MATMUL_MODES
from grpokit.train.models import ATTN_IMPLEMENTATIONS
from grpokit.train.optimizers import ADAM_FIELDS, OPTIMIZER_FIELDS, OPTIMIZERS, missing_package
from grpokit.train.schedule import SCHEDULE_FIELDS, SCHEDULES, WSD_SHAPES

from .optim import OptimConfig
from .sections import Config, ConfigError


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _one_of(name: str, value: Any, valid: tuple[str, ...] | list[str]) -> None:
    _check(value in valid, f"{name}={value!r} is not valid; choose one of: {', '.join(valid)}")


def _registered(field: str, kind: str, name: str) -> None:
    """A stage the registry knows (or can import as module:function): one sentence otherwise."""
    if is_import_path(name):
        try:
            lookup(kind, name)
        except ValueError as e:
            raise ConfigError(f"{field}: {e}") from None
    else:
        _check(
            name in registered(kind),
            f"{field}={name!r} is not valid; choose one of: {', '.join(registered(kind))} (or a module:function)",
        )


def _check_stages(cfg: Config) -> None:
    """The registered stages the config names, then every registered stage's own checks
    (``StageSpec.config_errors``, ``ObjectiveSpec.config_errors``): the values it reads, and the pairs
    it would silently ignore (tests/algo/test_combinations.py's table found them)."""
    a = cfg.algo
    _registered("algo.advantage", "advantage", a.advantage)
    _registered("algo.objective", "objective", a.objective)
    for name in a.token_masks:
        _registered("algo.token_masks", "token mask", name)
    for specs in STAGE_SPECS.values():
        for spec in specs.values():
            for message in spec.config_errors(cfg) if spec.config_errors is not None else []:
                _check(False, message)
    for name in registered("objective"):
        errors = objective_spec(name).config_errors
        for message in errors(a) if errors is not None else []:
            _check(False, message)


def validate(cfg: Config) -> Config:
    """Check every value that can be checked without loading anything; raise ``ConfigError``.
    The sections are checked in a fixed order; the first wrong value found is the one reported."""
    for check in (
        _model,
        _rollout,
        _algo_objective,
        _sampling_and_shaping,
        _algo_limits,
        _optim_train,
        _reward_env,
        _record_data,
    ):
        check(cfg)
    return cfg


def _model(cfg: Config) -> None:
    """model.*: dtype, device, autocast, LoRA and quantization."""
    a, m = cfg.algo, cfg.model
    _one_of("model.dtype", m.dtype, ("auto", "float32", "bfloat16", "float16"))
    _one_of("model.attn_implementation", m.attn_implementation, ATTN_IMPLEMENTATIONS)
    _check(
        m.device in ("auto", "cpu", "cuda") or m.device.startswith("cuda:"),
        f"model.device={m.device!r} is not valid; use auto, cpu, cuda or cuda:N",
    )
    _one_of("model.autocast", m.autocast, ("auto", "bfloat16", "float16", "off"))
    _one_of("model.cpu_matmul", m.cpu_matmul, CPU_MATMUL_MODES)
    _one_of("model.lora_save", m.lora_save, ("adapter", "merged"))
    _one_of("model.quantization", m.quantization, ("none", "4bit"))
    _check(m.lora_rank >= 0, f"model.lora_rank={m.lora_rank} must be >= 0 (0 = full fine-tuning)")
    _check(
        m.quantization == "none" or m.lora_rank > 0,
        f"model.quantization={m.quantization!r} trains adapters only; set model.lora_rank > 0 (e.g. 16)",
    )
    _check(0 <= m.lora_dropout < 1, f"model.lora_dropout={m.lora_dropout} must be in [0, 1)")
    _check(
        not (m.lm_head_fp32 and m.lora_rank and "lm_head" in m.lora_target_modules),
        "model.lm_head_fp32 keeps lm_head a plain float32 layer, but model.lora_target_modules puts an adapter on it; remove lm_head from the targets or set model.lm_head_fp32=false",
    )
    _check(
        not (m.compile and m.cpu_matmul == "onednn"),
        "model.compile=true cannot trace model.cpu_matmul='onednn' linears (torch.compile's inductor does not lower "
        "them); set model.cpu_matmul=auto (oneDNN off while compiling) or torch",
    )
    _one_of(
        "model.compile_mode",
        m.compile_mode,
        ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    )
    _check(
        not m.compile or m.compile_backend in torch_backends(),
        f"model.compile_backend={m.compile_backend!r} is not a torch.compile backend; use one of: {', '.join(torch_backends())}",
    )
    _check(
        m.neftune_noise_alpha >= 0,
        f"model.neftune_noise_alpha={m.neftune_noise_alpha} must be >= 0 (0 = off; the NEFTune paper uses 5)",
    )
    _check(
        m.router_aux_loss_coef >= 0 or m.router_aux_loss_coef == -1,
        f"model.router_aux_loss_coef={m.router_aux_loss_coef} must be >= 0 (0 = off) or -1 (the model config's own)",
    )
    _check(
        m.lora_rank == 0 or a.ref_refresh_every == 0,
        "algo.ref_refresh_every needs full fine-tuning; with LoRA the reference is the frozen base (set model.lora_rank=0 or algo.ref_refresh_every=0)",
    )


def _rollout(cfg: Config) -> None:
    """rollout.*: group size, sampling settings, engines, TIS and async staleness."""
    r, a = cfg.rollout, cfg.algo
    _check(r.group_size >= 1, f"rollout.group_size={r.group_size} must be at least 1")
    _check(
        r.max_prompt_tokens >= 0,
        f"rollout.max_prompt_tokens={r.max_prompt_tokens} must be >= 0 (0: the model's context)",
    )
    _check(
        r.group_size >= 2 or a.scale == "none" and a.baseline == "group_mean",
        f"rollout.group_size={r.group_size} is too small for group-relative advantages; use at least 2",
    )
    _check(r.max_new_tokens >= 1, f"rollout.max_new_tokens={r.max_new_tokens} must be at least 1")
    _check(r.temperature > 0, f"rollout.temperature={r.temperature} must be > 0")
    _check(0 < r.top_p <= 1, f"rollout.top_p={r.top_p} must be in (0, 1]")
    _check(r.top_k >= 0, f"rollout.top_k={r.top_k} must be >= 0 (0 = off)")
    _check(0 <= r.min_p < 1, f"rollout.min_p={r.min_p} must be in [0, 1)")
    _check(r.repetition_penalty > 0, f"rollout.repetition_penalty={r.repetition_penalty} must be > 0 (1.0 = off)")
    _one_of("rollout.backend", r.backend, ("hf", "vllm", "vllm_server"))
    _check(r.tis_cap == 0 or r.tis_cap >= 1, f"rollout.tis_cap={r.tis_cap} must be 0 (off) or >= 1")
    _one_of("rollout.tis_mode", r.tis_mode, TIS_MODES)
    _check(
        0 <= r.tis_min < float("inf") and (r.tis_cap == 0 or r.tis_min <= r.tis_cap),
        f"rollout.tis_min={r.tis_min} must be a number >= 0 (0 = no lower bound) and at most rollout.tis_cap={r.tis_cap}",
    )
    _check_performance(cfg)
    _rollout_engine(cfg)
    _check(r.async_staleness >= 0, f"rollout.async_staleness={r.async_staleness} must be >= 0 (0 = synchronous)")
    _check(r.vllm_startup_timeout > 0, f"rollout.vllm_startup_timeout={r.vllm_startup_timeout} must be > 0 seconds")
    _check(r.vllm_request_timeout > 0, f"rollout.vllm_request_timeout={r.vllm_request_timeout} must be > 0 seconds")
    _check(
        0 < r.vllm_gpu_memory_utilization <= 1,
        f"rollout.vllm_gpu_memory_utilization={r.vllm_gpu_memory_utilization} must be in (0, 1]",
    )
    _check(
        r.vllm_max_model_len >= 0,
        f"rollout.vllm_max_model_len={r.vllm_max_model_len} must be >= 0 (0: the model's own length)",
    )
    _check(
        type(r.vllm_tensor_parallel_size) is int and r.vllm_tensor_parallel_size >= 1,
        f"rollout.vllm_tensor_parallel_size={r.vllm_tensor_parallel_size!r} must be an integer >= 1 (1: one whole engine per rank)",
    )
    _check(
        r.vllm_tensor_parallel_size == 1 or r.backend == "vllm",
        f"rollout.vllm_tensor_parallel_size={r.vllm_tensor_parallel_size} shards the colocated engine of rollout.backend=vllm, "
        f"but rollout.backend={r.backend}; set it to 1 (a vLLM server takes `grpokit vllm-serve MODEL --tensor-parallel-size N`)",
    )


def _algo_objective(cfg: Config) -> None:
    """algo.*: advantage estimator, objective, aggregation and KL."""
    a, t = cfg.algo, cfg.train
    _one_of("algo.baseline", a.baseline, BASELINES)
    _one_of("algo.scale", a.scale, SCALES)
    _one_of("algo.std", a.std, STD_KINDS)
    _one_of("algo.ratio_level", a.ratio_level, RATIO_LEVELS)
    _check_stages(cfg)
    _one_of("algo.kl_estimator", a.kl_estimator, KL_ESTIMATORS)
    _one_of("algo.aggregation", a.aggregation, AGGREGATIONS)
    _check(
        a.lambda_lr > 0 and a.lambda_r > 0,
        f"algo.lambda_lr={a.lambda_lr} and algo.lambda_r={a.lambda_r} must be > 0 (defaults 0.01 and 0.1111)",
    )
    _check(
        a.aggregation != "lambda-grpo" or not t.fsdp,
        "algo.aggregation=lambda-grpo keeps lambda outside the sharded model; set train.fsdp=false",
    )
    _one_of("algo.kl_placement", a.kl_placement, tuple(KL_PLACEMENTS))
    _one_of("algo.entropy_aggregation", a.entropy_aggregation, ENTROPY_AGGREGATIONS)
    _check(
        not a.entropy_adaptive or (a.entropy_coef_delta >= 0 and 0 <= a.entropy_coef_min <= a.entropy_coef_max),
        f"algo.entropy_coef_delta={a.entropy_coef_delta}, algo.entropy_coef_min={a.entropy_coef_min} and "
        f"algo.entropy_coef_max={a.entropy_coef_max} must satisfy delta >= 0 and 0 <= min <= max (defaults 0.005, 0, 1)",
    )
    _check(a.kl_clamp >= 0, f"algo.kl_clamp={a.kl_clamp} must be >= 0 (0 = off; verl uses 10)")
    _check(
        not (a.kl_bias_correction and a.kl_placement == "reward" and a.beta > 0),
        "algo.kl_bias_correction weights the KL term of the loss, and algo.kl_placement=reward puts the KL in the reward instead; set algo.kl_bias_correction=false or algo.kl_placement=loss",
    )


def _sampling_and_shaping(cfg: Config) -> None:
    """GFPO, dynamic sampling, error correction, EDGE's entropy advantage and the reference refresh."""
    r, a = cfg.rollout, cfg.algo
    _one_of("rollout.gfpo_criterion", r.gfpo_criterion, ("length", "token_efficiency"))
    _check(
        r.sample_group_size == 0 or r.sample_group_size > r.group_size,
        f"rollout.sample_group_size={r.sample_group_size} must be 0 (off) or larger than rollout.group_size={r.group_size}",
    )
    _check(
        not r.gfpo_adaptive or r.sample_group_size > 0,
        "rollout.gfpo_adaptive needs rollout.sample_group_size > group_size",
    )
    _check(a.max_sampling_rounds >= 1, f"algo.max_sampling_rounds={a.max_sampling_rounds} must be at least 1")
    _check(
        a.entropy_advantage_max_scale >= 0,
        f"algo.entropy_advantage_max_scale={a.entropy_advantage_max_scale} must be >= 0 (0 = no cap)",
    )
    _one_of("algo.error_correction", a.error_correction, GEC_MODES)
    _check(
        a.error_correction == "off" or ":" in a.error_correction_fn,
        f"algo.error_correction={a.error_correction} needs algo.error_correction_fn=module:function rendering the gold answer (e.g. grpokit.data.tasks.arithmetic:format_completion)",
    )
    _check(
        a.error_correction == "off" or not a.dynamic_sampling,
        "algo.error_correction needs the all-wrong groups that algo.dynamic_sampling drops; turn one of them off",
    )
    _check(
        a.error_correction == "off" or (r.backend == "hf" and r.async_staleness == 0),
        "algo.error_correction injects tokens no sampler drew, which truncated importance sampling cannot weigh; use rollout.backend=hf with rollout.async_staleness=0",
    )
    _check(a.offpolicy_delta >= 0, f"algo.offpolicy_delta={a.offpolicy_delta} must be >= 0 (0 = off)")
    _check(a.ref_refresh_every >= 0, f"algo.ref_refresh_every={a.ref_refresh_every} must be >= 0")
    _check(
        0 < a.ref_mixup_alpha <= 1, f"algo.ref_mixup_alpha={a.ref_mixup_alpha} must be in (0, 1] (1 = copy the policy)"
    )
    _check(
        a.ref_refresh_every == 0 or a.beta > 0,
        "algo.ref_refresh_every needs algo.beta > 0 (without a KL term there is no reference model)",
    )


def _algo_limits(cfg: Config) -> None:
    """algo.*: numeric ranges of clipping, KL and iterations."""
    a = cfg.algo
    _check(0 <= a.clip_low < 1, f"algo.clip_low={a.clip_low} must be in [0, 1)")
    lowest = objective_spec(a.objective).min_clip_high  # CISPO's cap 1 + clip_high may sit below 1 (TRL's 0.2)
    _check(
        a.clip_high >= lowest,
        f"algo.clip_high={a.clip_high} must be >= {lowest:g} with algo.objective={a.objective}",
    )
    _check(a.dual_clip == 0 or a.dual_clip > 1, f"algo.dual_clip={a.dual_clip} must be 0 (off) or > 1")
    _check(a.beta >= 0, f"algo.beta={a.beta} must be >= 0")
    _check(a.adv_eps >= 0, f"algo.adv_eps={a.adv_eps} must be >= 0")
    _check(a.num_iterations >= 1, f"algo.num_iterations={a.num_iterations} must be at least 1")
    _check(a.norm_constant >= 0, f"algo.norm_constant={a.norm_constant} must be >= 0 (0 = max_new_tokens)")


def _optim_train(cfg: Config) -> None:
    """optim.* and train.*."""
    r, t, o = cfg.rollout, cfg.train, cfg.optim
    _optim(o)
    _check(t.steps >= 0, f"train.steps={t.steps} must be >= 0")
    _check(t.prompts_per_step >= 1, f"train.prompts_per_step={t.prompts_per_step} must be at least 1")
    n = t.prompts_per_step * r.group_size
    _check(t.micro_batch_size >= 0, f"train.micro_batch_size={t.micro_batch_size} must be >= 0")
    _check(
        t.micro_batch_tokens >= 0, f"train.micro_batch_tokens={t.micro_batch_tokens} must be >= 0 (0 = no token cap)"
    )
    _check(
        t.activation_memory_mb >= -1,
        f"train.activation_memory_mb={t.activation_memory_mb} must be -1 (auto), 0 (no budget) or a size in MB",
    )
    _check(
        t.micro_batch_size == 0 or n % t.micro_batch_size == 0,
        f"train.micro_batch_size={t.micro_batch_size} does not divide the batch of prompts_per_step * group_size = {n} completions; use a divisor of {n}",
    )
    _check(
        t.updates_per_batch >= 1 and n % t.updates_per_batch == 0,
        f"train.updates_per_batch={t.updates_per_batch} must be at least 1 and divide the batch of {n} completions",
    )
    _check(
        t.micro_batch_size == 0 or (n // max(1, t.updates_per_batch)) % t.micro_batch_size == 0,
        f"train.micro_batch_size={t.micro_batch_size} does not divide an update's slice of {n // max(1, t.updates_per_batch)} "
        "completions (the batch / train.updates_per_batch); use a divisor of it",
    )
    _accumulation(cfg)
    _check(t.dist_timeout_s >= 0, f"train.dist_timeout_s={t.dist_timeout_s} must be >= 0 seconds (0 = torch's default)")
    _check(t.stop_grace_s >= 0, f"train.stop_grace_s={t.stop_grace_s} must be >= 0 seconds (0 = cut the step at once)")
    _check(
        t.save_every >= 0 and t.eval_every >= 0 and t.keep_checkpoints >= 1,
        "train.save_every and train.eval_every must be >= 0 and train.keep_checkpoints >= 1",
    )


def _optim(o: OptimConfig) -> None:
    """optim.*: the optimizer, the schedule, their ranges, and no option set where nothing reads it."""
    _check(o.lr > 0, f"optim.lr={o.lr} must be > 0")
    _check(o.max_grad_norm >= 0, f"optim.max_grad_norm={o.max_grad_norm} must be >= 0 (0 = off)")
    _one_of("optim.optimizer", o.optimizer, tuple(OPTIMIZERS))
    problem = missing_package(o.optimizer)
    _check(problem is None, problem or "")
    _one_of("optim.schedule", o.schedule, tuple(SCHEDULES))
    for name in (
        "warmup_steps",
        "schedule_steps",
        "timescale",
        "num_decay_steps",
        "weight_decay",
        "momentum",
        "dampening",
        "lr_decay",
        "eps",
        "rms_alpha",
        "lr_end",
    ):
        _check(getattr(o, name) >= 0, f"optim.{name}={getattr(o, name)} must be >= 0")
    for name in ("num_cycles", "restart_cycles", "power"):
        _check(getattr(o, name) > 0, f"optim.{name}={getattr(o, name)} must be > 0")
    _check(0 <= o.min_lr_rate <= 1, f"optim.min_lr_rate={o.min_lr_rate} must be in [0, 1] (a fraction of optim.lr)")
    _check(
        o.warmup_lr_rate == -1 or 0 <= o.warmup_lr_rate <= 1,
        f"optim.warmup_lr_rate={o.warmup_lr_rate} must be -1 (1 / warmup_steps) or in [0, 1]",
    )
    _check(o.num_stable_steps >= -1, f"optim.num_stable_steps={o.num_stable_steps} must be -1 (the rest) or >= 0")
    _one_of("optim.warmup_type", o.warmup_type, WSD_SHAPES)
    _one_of("optim.decay_type", o.decay_type, WSD_SHAPES)
    _check(
        o.schedule != "polynomial" or o.lr_end < o.lr,
        f"optim.lr_end={o.lr_end} must be below optim.lr={o.lr} with optim.schedule=polynomial",
    )
    _check(
        not o.nesterov or (o.momentum > 0 and o.dampening == 0),
        f"optim.nesterov=true needs optim.momentum > 0 and optim.dampening = 0 (got {o.momentum}, {o.dampening})",
    )
    _unread(o, "schedule", SCHEDULE_FIELDS)
    _unread(o, "optimizer", OPTIMIZER_FIELDS, skip=ADAM_FIELDS)


def _unread(o: OptimConfig, kind: str, reads: dict[str, tuple[str, ...]], skip: tuple[str, ...] = ()) -> None:
    """An option of some optimizers (or schedules) set away from its default where ``o``'s does not read it."""
    default = OptimConfig()
    for name in sorted({n for names in reads.values() for n in names} - set(skip)):
        if getattr(o, name) != getattr(default, name) and name not in reads[getattr(o, kind)]:
            users = ", ".join(k for k, names in reads.items() if name in names)
            raise ConfigError(
                f"optim.{name}={getattr(o, name)!r} has no effect with optim.{kind}={getattr(o, kind)}; "
                f"it is read by optim.{kind} {users}"
            )


def _accumulation(cfg: Config) -> None:
    """train.accumulation_slices and train.max_updates: the rolling window leaves out what steps per update."""
    t, a = cfg.train, cfg.algo
    _check(t.accumulation_slices >= 1, f"train.accumulation_slices={t.accumulation_slices} must be at least 1")
    _check(t.max_updates >= 0, f"train.max_updates={t.max_updates} must be >= 0 (0 = train.steps decides)")
    _check(
        t.accumulation_epoch_steps >= 0,
        f"train.accumulation_epoch_steps={t.accumulation_epoch_steps} must be >= 0 (0 = none)",
    )
    _check(
        t.accumulation_epoch_steps == 0 or t.accumulation_slices > 1,
        f"train.accumulation_epoch_steps={t.accumulation_epoch_steps} has no effect with train.accumulation_slices=1 "
        "(every slice is its own update); leave it 0",
    )
    if t.accumulation_slices == 1:
        return
    _check(
        a.aggregation != "lambda-grpo" and a.entropy_coef == 0 and not a.entropy_adaptive,
        f"train.accumulation_slices={t.accumulation_slices} does not support algo.aggregation=lambda-grpo or an entropy "
        "bonus (algo.entropy_coef, algo.entropy_adaptive); set accumulation_slices=1 or turn those off",
    )
    _check(
        not t.fsdp,
        f"train.accumulation_slices={t.accumulation_slices} does not support train.fsdp (a pending update's "
        "sharded gradient is not saved with a checkpoint); set accumulation_slices=1 or fsdp=false",
    )


def _reward_env(cfg: Config) -> None:
    """reward.* and env.*."""
    c = cfg.reward
    _check(
        not c.weights or len(c.weights) >= len(c.functions),  # more: the rest weight callables passed to Trainer
        f"reward.weights has {len(c.weights)} entries but reward.functions has {len(c.functions)}; give one weight per function or none",
    )
    _check(c.timeout_s > 0, f"reward.timeout_s={c.timeout_s} must be > 0")
    _check(0 <= c.max_failure_fraction <= 1, f"reward.max_failure_fraction={c.max_failure_fraction} must be in [0, 1]")
    for name, params in c.params.items():  # a typo in a function's name would otherwise be ignored
        _check(
            name in c.functions,
            f"reward.params names {name!r}, which is not in reward.functions ({', '.join(c.functions) or 'empty'}); "
            "key reward.params by the name of a configured function",
        )
        _check(isinstance(params, dict), f"reward.params.{name}={params!r} must be a mapping of keyword arguments")
    try:  # the health section's own checks (set_field assigns fields one by one, past __post_init__)
        dataclasses.replace(cfg.health)
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err)) from None
    e = cfg.env
    _check(e.max_turns >= 1, f"env.max_turns={e.max_turns} must be at least 1")
    _check(e.max_episode_tokens >= 0, f"env.max_episode_tokens={e.max_episode_tokens} must be >= 0 (0 = no cap)")
    _one_of("env.tool_format", e.tool_format, ("auto", "chat_template", "tags"))
    _check(
        e.tool_timeout_s > 0 and e.episode_timeout_s > 0,
        f"env.tool_timeout_s={e.tool_timeout_s} and env.episode_timeout_s={e.episode_timeout_s} must be > 0",
    )
    _check(
        e.max_tool_output_chars >= 0, f"env.max_tool_output_chars={e.max_tool_output_chars} must be >= 0 (0 = no cap)"
    )
    _check(e.max_tool_nesting >= 0, f"env.max_tool_nesting={e.max_tool_nesting} must be >= 0 (0 = no cap)")
    _check(
        e.max_observation_chars >= 0, f"env.max_observation_chars={e.max_observation_chars} must be >= 0 (0 = no cap)"
    )
    _check(e.reset_timeout_s > 0, f"env.reset_timeout_s={e.reset_timeout_s} must be > 0")
    _check(0 <= e.max_failure_fraction <= 1, f"env.max_failure_fraction={e.max_failure_fraction} must be in [0, 1]")


def _record_data(cfg: Config) -> None:
    """record.sinks, data.* and the paths of the dataset and model."""
    m = cfg.model
    from grpokit.record.recorder import SINKS
    from grpokit.record.trackers import missing_package

    for sink in cfg.record.sinks:  # before any run folder exists: a missing tracker is one sentence, not a traceback
        _one_of("record.sinks", sink, ["jsonl", *SINKS])
        hint = missing_package(sink)
        _check(hint is None, f"record.sinks: {hint}")
    d = cfg.data
    _one_of("data.chat_template", d.chat_template, ("auto", "always", "never", "conversational"))
    _one_of("reward.convention", cfg.reward.convention, ("grpokit", "trl"))
    _check(d.eval_size >= 0, f"data.eval_size={d.eval_size} must be >= 0")
    if d.dataset and _looks_like_path(d.dataset):
        _check(
            Path(d.dataset).exists(),
            f"data.dataset={d.dataset!r} does not exist; give an existing .jsonl/.json/.parquet/.csv file or a hub dataset name",
        )
    if m.name_or_path != "demo" and _looks_like_path(m.name_or_path):
        _check(
            Path(m.name_or_path).is_dir(),
            f"model.name_or_path={m.name_or_path!r} does not exist; give a model folder, a hub id, or demo",
        )


def _check_performance(cfg: Config) -> None:
    """The padding-free, mismatch and memory fields."""
    r = cfg.rollout
    _one_of("train.packing", cfg.train.packing, ("auto", "packed", "padded"))
    _one_of("train.memory_plan", cfg.train.memory_plan, ("auto", "manual"))
    _one_of("rollout.mismatch_mask", r.mismatch_mask, ("none", "token", "sequence"))
    _check(0 < r.mismatch_low <= 1, f"rollout.mismatch_low={r.mismatch_low} must be in (0, 1]")
    _check(r.mismatch_high >= 1, f"rollout.mismatch_high={r.mismatch_high} must be >= 1")


# rollout.generation_kwargs keys set elsewhere: by a rollout field of their own, or by the engine
# itself (one completion per row, EOS and padding from the tokenizer, generate's plain tensor output)
GENERATE_OWN_KEYS = (
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "stop_strings",
    "eos_token_id",
    "pad_token_id",
    "num_return_sequences",
    "return_dict_in_generate",
    "output_scores",
    "output_logits",
)


def _rollout_engine(cfg: Config) -> None:
    """rollout.engine and rollout.generation_kwargs."""
    r = cfg.rollout
    _one_of("rollout.engine", r.engine, ("auto", "static", "dynamic", "generate"))
    _check(
        r.engine == "auto" or r.backend == "hf",
        f"rollout.engine={r.engine} picks a decode loop of rollout.backend=hf, "
        f"but rollout.backend={r.backend}; leave rollout.engine at auto",
    )
    _check(
        r.engine != "generate" or r.async_staleness == 0,
        "rollout.engine=generate records no sampling logprobs, which "
        f"asynchronous sampling's importance weights need, but rollout.async_staleness={r.async_staleness}; use 0",
    )
    _check(
        not r.generation_kwargs or r.engine == "generate",
        f"rollout.generation_kwargs={r.generation_kwargs} is read only "
        f"by rollout.engine=generate, but rollout.engine={r.engine}; set rollout.engine=generate or leave it empty",
    )
    own = [k for k in r.generation_kwargs if k in GENERATE_OWN_KEYS]
    _check(
        not own,
        f"rollout.generation_kwargs keys {own} are set elsewhere (the rollout fields temperature, top_p, top_k, "
        "min_p, max_new_tokens, repetition_penalty and stop, or the engine itself); remove them from generation_kwargs",
    )


def _looks_like_path(s: str) -> bool:
    return s.startswith((".", "/", "~")) or s.endswith((".jsonl", ".json", ".parquet", ".csv")) or s.count("/") > 1


def torch_backends() -> list[str]:
    """The torch.compile backends this torch offers (inductor, aot_eager, eager ...)."""
    import torch

    return sorted(torch.compiler.list_backends(exclude_tags=()))
