"""optim.*, train.* (batches, accumulation, checkpoints), reward.* and env.*."""

from __future__ import annotations

import dataclasses

from grpokit.config.health import LIVE_ONLY, HealthConfig
from grpokit.config.judge import JUDGE_READERS, judge_readers, spoken
from grpokit.config.optim import OPTIMIZER_FIELDS, OptimConfig, unread_optimizer_fields
from grpokit.config.sections import Config, ConfigError, RewardConfig
from grpokit.optim.optimizers import OPTIMIZERS, missing_package
from grpokit.optim.schedule import SCHEDULE_FIELDS, SCHEDULES, WSD_SHAPES

from .checks import check, one_of, unread


def check_optim_train(cfg: Config) -> None:
    """optim.* and train.*."""
    r, t, o = cfg.rollout, cfg.train, cfg.optim
    check_optim(o, cfg.algo.aggregation)
    check(t.steps >= 0, f"train.steps={t.steps} must be >= 0")
    check(0 <= t.seed < 2**32, f"train.seed={t.seed} must be an integer in [0, 2**32 - 1] (NumPy's seed range)")
    check(t.prompts_per_step >= 1, f"train.prompts_per_step={t.prompts_per_step} must be at least 1")
    n = t.prompts_per_step * r.group_size
    check(t.micro_batch_size >= 0, f"train.micro_batch_size={t.micro_batch_size} must be >= 0")
    check(t.micro_batch_tokens >= 0, f"train.micro_batch_tokens={t.micro_batch_tokens} must be >= 0 (0 = no token cap)")
    check(
        t.activation_memory_mb >= -1,
        f"train.activation_memory_mb={t.activation_memory_mb} must be -1 (auto), 0 (no budget) or a size in MB",
    )
    check(
        t.micro_batch_size == 0 or n % t.micro_batch_size == 0,
        f"train.micro_batch_size={t.micro_batch_size} does not divide the batch of prompts_per_step * group_size = "
        f"{n} completions; use a divisor of {n}",
    )
    check(
        t.updates_per_batch >= 1 and n % t.updates_per_batch == 0,
        f"train.updates_per_batch={t.updates_per_batch} must be at least 1 and divide the batch of {n} completions",
    )
    check(  # a short batch (dynamic sampling's rounds ran out) holds any number of groups: each must cut evenly
        not cfg.algo.dynamic_sampling or r.group_size % max(1, t.updates_per_batch) == 0,
        f"train.updates_per_batch={t.updates_per_batch} must divide rollout.group_size={r.group_size} with "
        "algo.dynamic_sampling=true: a step may train on fewer groups than train.prompts_per_step, and only then "
        "does every such batch cut into equal updates",
    )
    check(
        t.micro_batch_size == 0 or (n // max(1, t.updates_per_batch)) % t.micro_batch_size == 0,
        f"train.micro_batch_size={t.micro_batch_size} does not divide an update's slice of "
        f"{n // max(1, t.updates_per_batch)} "
        "completions (the batch / train.updates_per_batch); use a divisor of it",
    )
    _accumulation(cfg)
    check(t.dist_timeout_s >= 0, f"train.dist_timeout_s={t.dist_timeout_s} must be >= 0 seconds (0 = torch's default)")
    check(t.stop_grace_s >= 0, f"train.stop_grace_s={t.stop_grace_s} must be >= 0 seconds (0 = cut the step at once)")
    check(
        t.save_every >= 0 and t.eval_every >= 0 and t.keep_checkpoints >= 1,
        "train.save_every and train.eval_every must be >= 0 and train.keep_checkpoints >= 1",
    )


def check_optim(o: OptimConfig, aggregation: str = "") -> None:
    """optim.*: the optimizer, the schedule, their ranges, and no option set where nothing reads it
    (``aggregation``: algo.aggregation, whose lambda-grpo reads the betas: config/optim.py unread_optimizer_fields)."""
    check(o.lr > 0, f"optim.lr={o.lr} must be > 0")
    check(o.max_grad_norm >= 0, f"optim.max_grad_norm={o.max_grad_norm} must be >= 0 (0 = off)")
    one_of("optim.optimizer", o.optimizer, tuple(OPTIMIZERS))
    problem = missing_package(o.optimizer)
    check(problem is None, problem or "")
    one_of("optim.schedule", o.schedule, tuple(SCHEDULES))
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
        check(getattr(o, name) >= 0, f"optim.{name}={getattr(o, name)} must be >= 0")
    for name in ("num_cycles", "restart_cycles", "power"):
        check(getattr(o, name) > 0, f"optim.{name}={getattr(o, name)} must be > 0")
    check(0 <= o.min_lr_rate <= 1, f"optim.min_lr_rate={o.min_lr_rate} must be in [0, 1] (a fraction of optim.lr)")
    check(
        o.warmup_lr_rate == -1 or 0 <= o.warmup_lr_rate <= 1,
        f"optim.warmup_lr_rate={o.warmup_lr_rate} must be -1 (1 / warmup_steps) or in [0, 1]",
    )
    check(o.num_stable_steps >= -1, f"optim.num_stable_steps={o.num_stable_steps} must be -1 (the rest) or >= 0")
    one_of("optim.warmup_type", o.warmup_type, WSD_SHAPES)
    one_of("optim.decay_type", o.decay_type, WSD_SHAPES)
    check(
        o.schedule != "polynomial" or o.lr_end < o.lr,
        f"optim.lr_end={o.lr_end} must be below optim.lr={o.lr} with optim.schedule=polynomial",
    )
    check(
        not o.nesterov or (o.momentum > 0 and o.dampening == 0),
        f"optim.nesterov=true needs optim.momentum > 0 and optim.dampening = 0 (got {o.momentum}, {o.dampening})",
    )
    _unread(o, "schedule", SCHEDULE_FIELDS, _unread_schedule_fields(o.schedule))
    _unread(o, "optimizer", OPTIMIZER_FIELDS, unread_optimizer_fields(o.optimizer, aggregation))
    if not o.weight_decay:  # optim/decay.py's groups only say which parameters a decay reaches
        why, fix = "with optim.weight_decay=0 (nothing decays)", "set optim.weight_decay > 0"
        unread("optim", o, OptimConfig(), ("decay_norms_and_biases",), why, fix)


def _unread(o: OptimConfig, kind: str, reads: dict[str, tuple[str, ...]], names: list[str]) -> None:
    """The first of ``names`` (options ``o``'s optimizer or schedule, ``kind``, does not read; ``reads``: which
    of its kind read each) set away from its default, refused naming those that read it."""
    default = OptimConfig()
    for name in names:
        if getattr(o, name) != getattr(default, name):
            users = ", ".join(k for k, fields in reads.items() if name in fields)
            raise ConfigError(
                f"optim.{name}={getattr(o, name)!r} has no effect with optim.{kind}={getattr(o, kind)}; "
                f"it is read by optim.{kind} {users}"
            )


def _unread_schedule_fields(schedule: str) -> list[str]:
    """The schedules' options that ``schedule`` does not read (optim/schedule.py SCHEDULE_FIELDS)."""
    return sorted({n for fields in SCHEDULE_FIELDS.values() for n in fields} - set(SCHEDULE_FIELDS[schedule]))


def _accumulation(cfg: Config) -> None:
    """train.accumulation_slices and train.max_updates: the rolling window leaves out what steps per update."""
    t, a = cfg.train, cfg.algo
    check(t.accumulation_slices >= 1, f"train.accumulation_slices={t.accumulation_slices} must be at least 1")
    check(t.max_updates >= 0, f"train.max_updates={t.max_updates} must be >= 0 (0 = train.steps decides)")
    check(
        t.accumulation_epoch_steps >= 0,
        f"train.accumulation_epoch_steps={t.accumulation_epoch_steps} must be >= 0 (0 = none)",
    )
    check(
        t.accumulation_epoch_steps == 0 or t.accumulation_slices > 1,
        f"train.accumulation_epoch_steps={t.accumulation_epoch_steps} has no effect with train.accumulation_slices=1 "
        "(every slice is its own update); leave it 0",
    )
    if t.accumulation_slices == 1:
        return
    check(
        a.aggregation != "lambda-grpo" and a.entropy_coef == 0 and not a.entropy_adaptive,
        f"train.accumulation_slices={t.accumulation_slices} does not support algo.aggregation=lambda-grpo or an "
        "entropy "
        "bonus (algo.entropy_coef, algo.entropy_adaptive); set accumulation_slices=1 or turn those off",
    )
    check(
        not t.fsdp,
        f"train.accumulation_slices={t.accumulation_slices} does not support train.fsdp (a pending update's "
        "sharded gradient is not saved with a checkpoint); set accumulation_slices=1 or fsdp=false",
    )


def check_reward_env(cfg: Config) -> None:
    """reward.* and env.*."""
    c = cfg.reward
    check(
        not c.weights or len(c.weights) >= len(c.functions),  # more: the rest weight callables passed to Trainer
        f"reward.weights has {len(c.weights)} entries but reward.functions has {len(c.functions)}; give one weight "
        "per function or none",
    )
    check(c.timeout_s > 0, f"reward.timeout_s={c.timeout_s} must be > 0")
    check(0 <= c.max_failure_fraction <= 1, f"reward.max_failure_fraction={c.max_failure_fraction} must be in [0, 1]")
    for name, params in c.params.items():  # a typo in a function's name would otherwise be ignored
        check(
            name in c.functions,
            f"reward.params names {name!r}, which is not in reward.functions ({', '.join(c.functions) or 'empty'}); "
            "key reward.params by the name of a configured function",
        )
        check(isinstance(params, dict), f"reward.params.{name}={params!r} must be a mapping of keyword arguments")
    check_judge(cfg)
    try:  # the health section's own checks (set_field assigns fields one by one, past __post_init__)
        dataclasses.replace(cfg.health)
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err)) from None
    if not cfg.health.enabled:  # the doctor reads the thresholds; only the live monitors read these
        why = "with health.enabled=false (only the live monitors read it, not the doctor)"
        unread("health", cfg.health, HealthConfig(), LIVE_ONLY, why, "set health.enabled=true")
    e = cfg.env
    check(e.max_turns >= 0, f"env.max_turns={e.max_turns} must be at least 1, or 0 for no turn limit")
    check(
        e.max_turns or e.max_episode_tokens,
        "env.max_turns=0 (no turn limit) needs env.max_episode_tokens > 0 to bound an episode; set one of them",
    )
    check(e.max_episode_tokens >= 0, f"env.max_episode_tokens={e.max_episode_tokens} must be >= 0 (0 = no cap)")
    one_of("env.tool_format", e.tool_format, ("auto", "chat_template", "tags"))
    check(
        e.tool_timeout_s > 0 and e.episode_timeout_s > 0,
        f"env.tool_timeout_s={e.tool_timeout_s} and env.episode_timeout_s={e.episode_timeout_s} must be > 0",
    )
    check(
        e.max_tool_output_chars >= 0, f"env.max_tool_output_chars={e.max_tool_output_chars} must be >= 0 (0 = no cap)"
    )
    check(e.max_tool_nesting >= 0, f"env.max_tool_nesting={e.max_tool_nesting} must be >= 0 (0 = no cap)")
    check(
        e.max_observation_chars >= 0, f"env.max_observation_chars={e.max_observation_chars} must be >= 0 (0 = no cap)"
    )
    check(e.reset_timeout_s > 0, f"env.reset_timeout_s={e.reset_timeout_s} must be > 0")
    check(0 <= e.max_failure_fraction <= 1, f"env.max_failure_fraction={e.max_failure_fraction} must be in [0, 1]")


def check_judge(cfg: Config) -> None:
    """reward.judge: a list of names (whether each is one of the run's functions is known once they are built,
    train/reward_setup.py judged_columns), read only by the features judge_readers names."""
    judge = cfg.reward.judge
    check(
        isinstance(judge, list) and all(isinstance(n, str) and n for n in judge),
        f"reward.judge={judge!r} must be a list of reward function names (e.g. [task]), or [] for the reward as "
        "trained",
    )
    if not judge_readers(cfg):
        why = f"unless {spoken([name for name, _ in JUDGE_READERS])} is on"
        unread("reward", cfg.reward, RewardConfig(), ["judge"], f"{why} (nothing else judges a completion)", "set one")
