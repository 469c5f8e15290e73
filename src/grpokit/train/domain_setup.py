"""A run's domains (data.domains, docs/DOMAINS.md) become its rows, rewards, held-out runners and sampler.

Each domain is read as if it were a run of its own: a copy of the config whose data and reward sections
are the domain's, passed through the same functions a one-task run uses (run_data.data_rows,
reward_setup.reward_specs, reward_setup.eval_runner). Its rows are tagged with the ``domain`` column, its
reward functions wrapped to score only that domain (data/domains.py). Without domains, ``make_sampler``
is the plain PromptSampler (or the frontier curriculum's), and nothing here runs.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace
from typing import Callable

from grpokit.config.base import named_as
from grpokit.config.judge import DYNAMIC_SAMPLING, judge_readers, spoken
from grpokit.config.sections import Config, ConfigError
from grpokit.data.curriculum import FrontierSampler
from grpokit.data.domain_sampler import DomainSampler
from grpokit.data.domains import COLUMN, INHERITED, OWN, Domain, DomainReward, parse_domains
from grpokit.data.prompt_sampler import PromptSampler
from grpokit.rewards.runner import RewardRunner
from grpokit.rewards.spec import RewardSpec, reward_name

from . import reward_setup, run_data

log = logging.getLogger("grpokit")


def domains_of(cfg: Config) -> list[Domain]:
    """The run's domains ([] without data.domains)."""
    return parse_domains(cfg.data.domains, cfg.data, cfg.reward) if cfg.data.domains else []


def refuse_beside_domains(cfg: Config, own_rows: bool) -> None:
    """Refuse what data.domains cannot be combined with: a run value of a field the domains replace
    (data.task_params, data.eval_dataset ...: data/domains.py ``refuse_replaced``), rows passed to the
    Trainer, tools or an environment. Called before anything reads the run's data.task (the demo's settings),
    so the sentence names the field that was set, not a task the domains replace."""
    if not cfg.data.domains:
        return
    if own_rows:
        raise ConfigError(
            "data.domains replaces rows passed to the Trainer; give the rows as a domain's dataset "
            "(data.domains.<name>.dataset=FILE) instead"
        )
    domains_of(cfg)  # the domains parsed: data.dataset, data.eval_dataset ... beside them refused
    if cfg.env.tools or cfg.env.environment:
        raise ConfigError("data.domains with env.tools or env.environment is not supported yet; drop one of them")


def settle_domains(cfg: Config) -> Config:
    """Check every domain's task and rewards by name (before any model is loaded; refuse_beside_domains has
    refused what cannot be combined with them); data.task becomes "" (the domains replace it)."""
    if cfg.data.curriculum not in ("off", "frontier"):
        raise ConfigError(f"data.curriculum={cfg.data.curriculum!r} is not a curriculum; valid: off, frontier")
    if not cfg.data.domains:
        return cfg
    for d in domains_of(cfg):
        with as_domain(d.name):
            task = run_data.task_of(domain_config(cfg, d))
        if task is not None and (task.evaluate is None or task.tools):
            raise ConfigError(
                f"data.domains.{d.name}: task {d.task!r} needs the episode loop or image prompts, which a domain "
                "does not support yet; train it on its own (data.task)"
            )
    _check_unsampled(cfg)
    cfg.data.task = ""
    return cfg


def _check_unsampled(cfg: Config) -> None:
    """A domain with share 0 is sampled only by a stage that names it: without one it is refused when it
    has no held-out set (nothing would read it), and warned about once when it is only evaluated. A stage
    naming it beside domains with a share mixes its domains equally (DomainSampler), warned about once."""
    named = set()
    shares = {d.name: d.share for d in domains_of(cfg)}
    for i, spec in enumerate(cfg.train.stages):
        names = spec.get("domain") if isinstance(spec, dict) else None
        names = [names] if isinstance(names, str) else list(names or ())
        named.update(names)
        zero = [n for n in names if shares.get(n) == 0]
        if zero and len(zero) < len(names):
            print(
                f"grpokit: warning: train.stages[{i}] names {', '.join(zero)} with share 0 beside domains with a "
                f"share, so its domains {', '.join(names)} share its batches equally (shares cannot mix a share-0 "
                "domain); give every one of them a positive share to mix them by share",
                flush=True,
            )
    for d in domains_of(cfg):
        if d.share > 0 or d.name in named:
            continue
        if not (d.eval_size > 0 and (d.eval_dataset or (d.task and not d.dataset))):
            raise ConfigError(
                f"data.domains.{d.name}.share=0 and no train.stages entry names it, and it has no held-out set, so "
                "it would be neither trained on nor evaluated; give it a positive share, name it in a stage's "
                "domain, or remove it"
            )
        print(
            f"grpokit: warning: data.domains.{d.name} has share 0 and no train.stages entry names it: it is "
            "evaluated on its held-out set but never trained on",
            flush=True,
        )


# the run's fields a domain's copy of the config carries its own values in (domain_config)
_CARRIED = {
    **{f"data.{k}": k for k in (*OWN, *INHERITED)},  # config/sections.py BESIDE_DOMAINS: a domain's keys
    **{f"reward.{k}": f"reward_{k}" for k in ("functions", "weights", "params")},
}


def as_domain(name: str):
    """Errors raised while a domain is read as a run name that domain's own fields (data.domains.<name>.*)."""
    return named_as({run: f"data.domains.{name}.{own}" for run, own in _CARRIED.items()})


def domain_config(cfg: Config, d: Domain) -> Config:
    """A copy of ``cfg`` whose data and reward sections are domain ``d``'s alone."""
    sub = copy.deepcopy(cfg)
    data, rew = sub.data, sub.reward
    data.domains = {}
    for key in (*OWN, *INHERITED):  # the shared fields (system_prompt, curriculum ...) stay the run's
        setattr(data, key, copy.deepcopy(getattr(d, key)))
    rew.functions, rew.weights, rew.params = list(d.reward_functions), list(d.reward_weights), dict(d.reward_params)
    return sub


def domain_rows(cfg: Config) -> tuple[list[dict], list[dict]]:
    """Every domain's training and held-out rows, each tagged with its domain's name (``domain`` column)."""
    train, held_out = [], []
    for d in domains_of(cfg):
        with as_domain(d.name):
            sub = domain_config(cfg, d)
            rows, eval_rows = run_data.data_rows(sub, None, None)
            run_data.check_gold_answers(sub, rows)
            run_data.check_gold_answers(sub, eval_rows, held_out=True)
        if any(COLUMN in r for r in rows[:1] + eval_rows[:1]):  # loaded rows: the first has every column
            raise ConfigError(
                f"data.domains.{d.name}: its data has a column {COLUMN!r}, which grpokit sets to the domain's name "
                f"and so would replace; rename that column"
            )
        train += [{**r, COLUMN: d.name} for r in rows]
        held_out += [{**r, COLUMN: d.name} for r in eval_rows]
    return train, held_out


def domain_reward_specs(cfg: Config, extra: list[Callable] | None) -> list[RewardSpec]:
    """Each domain's reward functions, scoring its own groups only, named ``<domain>/<function>`` (so every
    per-reward metric is per domain: rewards/<domain>/<function>/mean ...); passed callables score every
    domain (weight 1)."""
    specs = []
    for d in domains_of(cfg):
        with as_domain(d.name):
            own = reward_setup.reward_specs(domain_config(cfg, d), None, None)
        for sp in own:
            specs.append(RewardSpec(fn=DomainReward(sp.fn, d.name), name=f"{d.name}/{sp.name}", weight=sp.weight))
    for f in extra or []:
        specs.append(RewardSpec(fn=f, name=reward_name(f), weight=1.0))
    return specs


def follow_settings(cfg: Config, specs: list[RewardSpec]) -> list[RewardSpec]:
    """The run's reward specs (as build.build_rewards built them) with each function whose parameters follow the
    run's settings resolved again from ``cfg`` as it is now (reward_setup.follow_settings): a domain's functions
    from its own config (``domain_config``), wrapped to score its domain alone as before."""
    if not cfg.data.domains:
        return reward_setup.follow_settings(cfg, specs)
    out, at = list(specs), 0
    for d in domains_of(cfg):
        with as_domain(d.name):
            sub = domain_config(cfg, d)
            n = len(reward_setup.spec_sources(sub))  # a domain's own: its named functions, no passed one
            own = [replace(s, fn=s.fn.fn) for s in out[at : at + n]]
            fresh = reward_setup.follow_settings(sub, own)
        out[at : at + n] = [
            s if f.fn is o.fn else replace(s, fn=DomainReward(f.fn, d.name))
            for s, o, f in zip(out[at : at + n], own, fresh)
        ]
        at += n
    return out


def judged_columns(cfg: Config, specs: list[RewardSpec]) -> list[int] | None:
    """The columns of the run's reward ``specs`` whose sum judges a completion right (reward.judge,
    reward_setup.judged_columns; None: the weighted total), read by dynamic sampling, the frontier curriculum and
    error correction. With domains "task" is each domain's own task verifier, and every domain needs a judged
    column, or each of its completions would be judged 0 alike."""
    names = cfg.reward.judge
    if not cfg.data.domains:
        return reward_setup.judged_columns(names, specs, reward_setup.spec_sources(cfg, len(specs)))
    sources: list[str | None] = []
    for d in domains_of(cfg):
        with as_domain(d.name):
            sources += reward_setup.spec_sources(domain_config(cfg, d))
    columns = reward_setup.judged_columns(names, specs, sources + [None] * (len(specs) - len(sources)))
    judged = {getattr(specs[i].fn, "domain", None) for i in columns or ()}
    for d in domains_of(cfg) if columns is not None and None not in judged else ():
        if d.name not in judged:
            own = ", ".join(s.name for s in specs if getattr(s.fn, "domain", None) == d.name)
            raise ConfigError(
                f"reward.judge={names} judges none of data.domains.{d.name}'s reward functions, so each of its "
                "completions would be judged 0 alike (no group kept by dynamic sampling, no pass for the curriculum, "
                f"every group corrected); add one of them ({own}) or task for its task's verifier"
            )
    return columns


def warn_unjudged(cfg: Config, specs: list[RewardSpec]) -> None:
    """Warned once at start: the frontier curriculum's pass or error correction's all-wrong test reads the reward
    as trained (reward.judge empty) while that reward sums several functions (a domain's), so a shaping term
    decides what only correctness should (a wrong answer with a format bonus of 0.5 passes a threshold of 0.5).
    Dynamic sampling is not warned about: its default, groups flat in the reward as trained, is those without a
    gradient."""
    readers = judge_readers(cfg, besides=(DYNAMIC_SAMPLING,))
    counts: dict[str | None, list[str]] = {}
    for s in specs:
        if s.weight:
            counts.setdefault(getattr(s.fn, "domain", None), []).append(s.name)
    summed = next((names for names in counts.values() if len(names) > 1), None)
    if cfg.reward.judge or not readers or summed is None:
        return
    verb = "judges" if len(readers) == 1 else "judge"
    print(
        f"grpokit: warning: {spoken(readers, 'and')} {verb} a completion by the reward as trained (reward.judge is "
        f"empty), the weighted sum of {', '.join(summed)}: a shaping term there counts towards a pass and keeps a "
        "group from being all wrong; set reward.judge to the functions that say whether an answer is right "
        "(e.g. [task])",
        flush=True,
    )


def domain_graders(cfg: Config) -> dict[str, tuple[RewardSpec, str | None]]:
    """Each domain's grader (reward_setup.grader on the domain's own config: its task's verifier, else its
    first reward function) and the name of its column among the training rewards (``<domain>/<function>``,
    as domain_reward_specs names them; None when the task's verifier is not among the domain's functions).
    The held-out evaluation and the per-step ``domain/<d>/accuracy`` both read it, so they grade alike."""
    graders = {}
    for d in domains_of(cfg):
        with as_domain(d.name):
            sub = domain_config(cfg, d)
            own = reward_setup.reward_specs(sub, None, None)
            spec, at = reward_setup.grader(sub, own)
        graders[d.name] = (spec, None if at is None else f"{d.name}/{own[at].name}")
    return graders


def domain_eval_runners(
    graders: dict[str, tuple[RewardSpec, str | None]], convention: str = "grpokit"
) -> dict[str, RewardRunner]:
    """The runner of each domain's held-out set: its grader alone (``domain_graders``), read under the run's
    reward.convention."""
    return {d: RewardRunner([spec], num_workers=0, convention=convention) for d, (spec, _) in graders.items()}


def training_graders(graders: dict[str, tuple[RewardSpec, str | None]]) -> dict[str, str]:
    """Each domain's grader column among the training rewards, for ``domain/<d>/accuracy``; a domain whose
    task verifier is not among its reward functions is warned about once and gets no per-step accuracy."""
    for d, (_, column) in graders.items():
        if column is None:
            print(
                f"grpokit: warning: data.domains.{d}: its task's verifier is not among its reward_functions, so "
                f"domain/{d}/accuracy is not logged per step (the held-out eval/domain/{d}/accuracy grades with "
                "it); add 'task' to its reward_functions (weight 0 leaves its reward unchanged) to log it",
                flush=True,
            )
    return {d: column for d, (_, column) in graders.items() if column is not None}


def make_sampler(cfg: Config, prompts: list, group_size: int, world_size: int = 1):
    """The run's prompt sampler: per domain (by share) when there are domains, each domain's (or the
    run's) order plain or at the frontier (data.curriculum)."""
    d = cfg.data
    if d.curriculum == "frontier" and world_size > 1:  # each rank would learn pass rates from its own slice
        raise ConfigError(
            "data.curriculum=frontier runs in one process only for now (each rank would count its own groups and "
            "draw other prompts); set data.curriculum=off under torchrun"
        )

    def pool(rows: list, seed: int):
        if d.curriculum == "off":
            return PromptSampler(rows, seed, d.shuffle)
        return FrontierSampler(
            rows,
            seed,
            key=d.curriculum_key,
            threshold=d.curriculum_threshold,
            decay=d.curriculum_decay,
            floor=d.curriculum_floor,
            group_size=group_size,
        )

    domains = domains_of(cfg)
    if not domains:
        return plain_sampler(cfg, prompts) if d.curriculum == "off" else pool(prompts, cfg.train.seed)
    by_name = {dm.name: [p for p in prompts if p.columns.get(COLUMN) == dm.name] for dm in domains}
    for name, rows in by_name.items():
        if not rows:
            raise ConfigError(f"data.domains.{name} has no training prompts; check its task or dataset")
    seeds = {dm.name: cfg.train.seed * 7919 + i for i, dm in enumerate(domains)}  # distinct orders per domain
    pools = {n: pool(rows, seeds[n]) for n, rows in by_name.items()}
    return DomainSampler(pools, {dm.name: dm.share for dm in domains})


def plain_sampler(cfg: Config, prompts: list) -> PromptSampler:
    """The run's plain order: whole batches of train.prompts_per_step with data.drop_last (fewer rows refused);
    without it, fewer rows than a batch make every step repeat a prompt, which the run says once."""
    d, batch = cfg.data, cfg.train.prompts_per_step
    if not d.drop_last and len(prompts) < batch:
        log.warning(
            "grpokit: warning: the training data has %d prompts, fewer than train.prompts_per_step=%d, so every "
            "step samples some prompt twice (as two groups); give more rows or lower train.prompts_per_step",
            len(prompts),
            batch,
        )
    return PromptSampler(prompts, cfg.train.seed, d.shuffle, batch=batch if d.drop_last else 0)
