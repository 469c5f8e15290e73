"""Rounds: train.stages, a schedule of stages over the one loop (docs/DOMAINS.md).

A stage is a number of steps, the domains it samples (one, several, or every one by share) and a few
overrides of the run's own settings: the learning rate, the group size, the generation length, the
sampling temperature and the reward weights. Step s of the run belongs to the stage whose steps cover
it; every metrics row carries ``stage`` (its index) and ``stage/step`` (the step within it, from 0).

The stage of a step is a function of the step alone, and everything a stage changes is re-applied
when a resumed run enters its stage (train/trainer_stages.py), so a run resumed in the middle of a
stage is the uninterrupted run, as a one-stage run is.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from grpokit.config.io import assigned, set_field
from grpokit.config.sections import Config, ConfigError
from grpokit.data.domains import check_domain_names
from grpokit.validation import validate

from .domain_setup import domains_of

# a stage's override -> the config field it stands in for
OVERRIDES = {
    "lr": "optim.lr",
    "group_size": "rollout.group_size",
    "max_new_tokens": "rollout.max_new_tokens",
    "temperature": "rollout.temperature",
}
KEYS = ("name", "domain", "steps", *OVERRIDES, "reward_weights", "teacher")


@dataclass(frozen=True)
class Stage:
    """One stage of train.stages."""

    steps: int
    domains: tuple[str, ...] | None = None
    """The domains it samples (None: every domain with a positive share)."""
    overrides: tuple[tuple[str, object], ...] = ()
    """(config field, value) pairs, e.g. ("optim.lr", 1e-5)."""
    reward_weights: dict | list | None = None
    """A list (the stage's one domain's functions, or the run's without domains) or {domain: list}."""
    name: str = ""
    teacher: str = ""
    """On-policy distillation's teacher during this stage (a domain's expert); empty: algo.distill_teacher."""


def parse_stages(cfg: Config) -> list[Stage]:
    """The stages of train.stages ([] without), each checked: its keys, steps, domains and overrides
    (applied to a copy of the config and validated like the run's own values)."""
    raw, domains = cfg.train.stages, domains_of(cfg)
    stages = []
    for i, spec in enumerate(raw):
        where = f"train.stages[{i}]"
        if not isinstance(spec, dict):
            raise ConfigError(f"{where} must be a mapping (steps, domain, lr ...), got {spec!r}")
        unknown = [k for k in spec if k not in KEYS]
        if unknown:
            raise ConfigError(f"{where} has the unknown key {unknown[0]!r}; valid keys: {', '.join(KEYS)}")
        steps = spec.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"{where}.steps must be an integer >= 1 (the stage's length), got {steps!r}")
        names = spec.get("domain")
        names = None if names is None else tuple([names] if isinstance(names, str) else names)
        if names is not None:
            check_domain_names(names, domains, f"{where}.domain")
        stage = Stage(
            steps=steps,
            domains=names,
            overrides=tuple((OVERRIDES[k], spec[k]) for k in OVERRIDES if k in spec),
            reward_weights=spec.get("reward_weights"),
            name=str(spec.get("name", "")),
            teacher=str(spec.get("teacher") or ""),
        )
        if stage.teacher and not cfg.algo.distill_teacher:
            raise ConfigError(
                f"{where}.teacher={stage.teacher!r} needs distillation on: set algo.distill_teacher (the teacher of "
                "stages without one) and algo.distill_coef > 0 or algo.beta > 0"
            )
        _check_overrides(cfg, stage, where)
        _check_async(cfg, spec, where)
        stages.append(stage)
    return stages


SAMPLED = ("domain", *(k for k, f in OVERRIDES.items() if f.startswith("rollout.")))  # keys that change sampling


def _check_async(cfg: Config, spec: dict, where: str) -> None:
    """An asynchronous sampler draws batch j's prompts and completions before step j (rollout/async_plan.py),
    so a stage's domains or sampling settings would reach its first batches late, or never reach rollout
    worker processes: refused. The learning rate, reward weights and teacher act at the update."""
    s = cfg.rollout.async_staleness
    key = next((k for k in SAMPLED if k in spec), None)
    if s > 0 and key is not None:
        raise ConfigError(
            f"{where}.{key} changes what is sampled, which the asynchronous sampler would apply late "
            f"(rollout.async_staleness={s} draws each batch up to {s} step(s) before the step whose stage it "
            "belongs to); use rollout.async_staleness=0, or stages that change only lr, reward_weights or teacher"
        )


def _check_overrides(cfg: Config, stage: Stage, where: str) -> None:
    trial = copy.deepcopy(cfg)
    trial.train.stages = []
    try:
        for name, value in stage.overrides:
            set_field(trial, name, value)
        validate(trial)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def put_rollout(cfg: Config, base: Config, stage: Stage) -> None:
    """The stage's sampling settings (group size, length, temperature) into ``cfg``: the stage's where it gives
    one, else the run's own (``base``)."""
    given = dict(stage.overrides)
    for name in (n for n in OVERRIDES.values() if n.startswith("rollout.")):
        field = name.split(".")[1]
        setattr(cfg.rollout, field, getattr(base.rollout, field))
        if name in given:
            set_field(cfg, name, given[name])


def run_values(cfg: Config, name: str) -> list:
    """The values config field ``name`` (one a stage overrides, e.g. rollout.max_new_tokens) takes during the
    run: each stage's (its override, else the run's own), or the run's own alone without stages."""
    key = next(k for k, field in OVERRIDES.items() if field == name)
    section, field = name.split(".")
    own = getattr(getattr(cfg, section), field)
    return [s.get(key, own) if isinstance(s, dict) else own for s in cfg.train.stages] or [own]


def settle_stages(cfg: Config) -> Config:
    """train.steps becomes the stages' sum (a train.steps set to another number is refused)."""
    if not cfg.train.stages:
        return cfg
    total = sum(s.steps for s in parse_stages(cfg))
    if "train.steps" in assigned(cfg) and cfg.train.steps != total:
        raise ConfigError(
            f"train.stages add up to {total} steps but train.steps={cfg.train.steps}; leave train.steps out "
            "(it becomes the stages' sum) or make them agree"
        )
    cfg.train.steps = total
    return cfg


def stage_at(stages: list[Stage], step: int) -> tuple[int, int]:
    """(stage index, step within it) of run step ``step`` (from 0); past the end: the last stage."""
    start = 0
    for i, s in enumerate(stages):
        if step < start + s.steps:
            return i, step - start
        start += s.steps
    return len(stages) - 1, step - (start - stages[-1].steps)


def stage_weights(stage: Stage, spec_domains: list[str | None], base: list[float]) -> list[float]:
    """The reward weights of a stage: ``base`` (the run's, one per reward function) with the stage's
    reward_weights in place for the functions they name. ``spec_domains``: each function's domain (None:
    a function of every domain, or of a run without domains)."""
    rw = stage.reward_weights
    if rw is None:
        return list(base)
    if isinstance(rw, list):
        if stage.domains is not None and len(stage.domains) != 1:
            raise ConfigError(
                "a stage's reward_weights list needs one domain in the stage; give {domain: [weights]} instead"
            )
        rw = {stage.domains[0] if stage.domains else None: rw}
    if not isinstance(rw, dict):
        raise ConfigError(f"a stage's reward_weights must be a list or a mapping domain -> list, got {rw!r}")
    out = list(base)
    for d, weights in rw.items():
        slots = [j for j, sd in enumerate(spec_domains) if sd == d]
        if len(weights) != len(slots):
            raise ConfigError(
                f"a stage's reward_weights for {d or 'the run'} has {len(weights)} entries for {len(slots)} reward "
                "functions; give one weight per function"
            )
        for j, w in zip(slots, weights):
            out[j] = float(w)
    return out
