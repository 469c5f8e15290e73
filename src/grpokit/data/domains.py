"""Domains: several named sources of prompts in one run, each with its own rewards and held-out set.

A domain is data (stage 1): its rows carry a ``domain`` column, the sampler mixes domains by share
(data/domain_sampler.py), and each of its reward functions is wrapped so that it scores only its own
domain's groups and answers None (not applicable) for the others. The runner's weighted sum skips
None, so a completion's total is its own domain's reward; advantages are normalised within the group
as always (a group is one prompt, so one domain). Nothing downstream of stage 3 knows about domains.

``data.domains`` is a mapping ``{name: {key: value}}``; ``parse_domains`` turns it into ``Domain``
records and refuses what it cannot run, one sentence each.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from grpokit.config.sections import ConfigError, DataConfig, RewardConfig, beside_domains
from grpokit.rewards.spec import call_reward, passes_group_size, reward_name

COLUMN = "domain"  # the column every domain row carries (reward functions may read it as ``domain``)


@dataclass(frozen=True)
class Domain:
    """One domain of ``data.domains``: where its rows come from, its share of every batch, its rewards."""

    name: str
    task: str = ""
    """Built-in task (as data.task); empty when ``dataset`` is given."""
    task_params: dict = field(default_factory=dict)
    dataset: str = ""
    """Own training data (as data.dataset)."""
    split: str = "train"
    eval_dataset: str = ""
    eval_split: str = "test"
    eval_size: int = 500
    share: float = 1.0
    """Relative share of every batch's prompts (the shares are normalised to sum to 1)."""
    reward_functions: tuple[str, ...] = ("task",)
    reward_weights: tuple[float, ...] = ()
    reward_params: dict = field(default_factory=dict)
    prompt_column: str = "prompt"
    answer_column: str = "answer"


OWN = beside_domains("own")  # task, task_params, dataset, eval_dataset: a run value beside domains is refused
INHERITED = beside_domains("inherited")  # split, eval_split, eval_size, the columns: left out, the run's value
KEYS = (*OWN, *INHERITED, "share", "reward_functions", "reward_weights", "reward_params")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")  # fullmatch: "$" would let a trailing newline through


def parse_domains(raw: dict, data: DataConfig, reward: RewardConfig) -> list[Domain]:
    """The domains of ``data.domains`` (in the order given); a key a domain leaves out is the run's own
    (``INHERITED``: data.split, data.eval_size, data.prompt_column ...; and reward.functions, reward.weights,
    reward.params), and a run value of a key only a domain has (``OWN``: data.task_params, data.eval_dataset
    ...) is refused: config/sections.py's BESIDE_DOMAINS says which is which. A domain named after a built-in
    task with neither task nor dataset is that task."""
    if not isinstance(raw, dict):
        raise ConfigError(f"data.domains must be a mapping of name -> settings, got {raw!r}")
    if raw:
        refuse_replaced(data)
    domains = [_domain(name, spec, data, reward) for name, spec in raw.items()]
    total = sum(d.share for d in domains)
    if domains and not total > 0:
        raise ConfigError(
            f"data.domains: the shares ({', '.join(f'{d.name}={d.share:g}' for d in domains)}) sum to {total:g}; "
            "give at least one domain a positive share"
        )
    return domains


def refuse_replaced(data: DataConfig) -> None:
    """Refuse a run value of a field the domains replace (``OWN``: data.task other than its default,
    data.task_params, data.dataset, data.eval_dataset), naming it: each domain has its own, so the run's would
    reach no domain (or, inherited, give every domain the same held-out file or task parameters)."""
    default = DataConfig()
    for key in OWN:
        value = getattr(data, key)
        if value and value != getattr(default, key):
            raise ConfigError(
                f"data.domains replaces data.{key}, but data.{key}={value!r} is set beside it (each domain has its "
                f"own); give it to the domain it belongs to as data.domains.<name>.{key}, or leave data.{key} out"
            )


def _domain(name: Any, spec: Any, data: DataConfig, reward: RewardConfig) -> Domain:
    where = f"data.domains.{name}"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"data.domains has the name {name!r}; a domain's name starts with a letter and holds only letters, "
            "digits, '_' and '-' (it names metrics: domain/<name>/reward)"
        )
    spec = {} if spec is None else spec
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a mapping of settings (task, dataset, share ...), got {spec!r}")
    unknown = [k for k in spec if k not in KEYS]
    if unknown:
        raise ConfigError(f"{where} has the unknown key {unknown[0]!r}; valid keys: {', '.join(KEYS)}")
    task, dataset = str(spec.get("task") or ""), str(spec.get("dataset") or "")
    if task and dataset:
        raise ConfigError(f"{where} gives both task={task!r} and dataset={dataset!r}; give one of them")
    if not task and not dataset:
        task = name  # {arithmetic: {}} is the arithmetic task; an unknown name is refused where it is looked up
    share = spec.get("share", 1.0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share) or share < 0:
        raise ConfigError(f"{where}.share must be a number >= 0 (a relative share of each batch), got {share!r}")
    functions = spec.get("reward_functions", reward.functions)
    if isinstance(functions, str):
        functions = [functions]
    if not isinstance(functions, (list, tuple)) or not all(isinstance(f, str) and f for f in functions):
        raise ConfigError(f"{where}.reward_functions must be a list of reward names, got {functions!r}")
    for key in ("task_params", "reward_params"):
        if not isinstance(spec.get(key) or {}, dict):
            raise ConfigError(f"{where}.{key} must be a mapping, got {spec[key]!r}")
    for key in ("task", "dataset", "eval_dataset"):
        if not isinstance(spec.get(key, ""), (str, type(None))):
            raise ConfigError(f"{where}.{key} must be a string, got {spec[key]!r}")
    weights = spec.get("reward_weights", reward.weights if "reward_functions" not in spec else [])
    if not isinstance(weights, (list, tuple)) or not all(_finite(w) for w in weights):
        raise ConfigError(f"{where}.reward_weights must be a list of numbers, got {weights!r}")
    if weights and len(weights) != len(functions):
        raise ConfigError(
            f"{where}.reward_weights has {len(weights)} entries for {len(functions)} reward functions "
            f"({', '.join(map(str, functions))}); give one weight per function or none"
        )
    return Domain(
        name=name,
        task=task,
        task_params=dict(spec.get("task_params") or {}),
        dataset=dataset,
        eval_dataset=str(spec.get("eval_dataset") or ""),
        share=float(share),
        reward_functions=tuple(str(f) for f in functions),
        reward_weights=tuple(float(w) for w in weights),
        reward_params=dict(spec.get("reward_params", reward.params) or {}),
        **_inherited(spec, data, where),
    )


def _inherited(spec: dict, data: DataConfig, where: str) -> dict[str, Any]:
    """The domain's ``INHERITED`` keys (split, eval_size, the columns ...): its own value where it gives one,
    else the run's data.* value; each checked as its field's type (a string, an integer >= 0)."""
    out = {}
    for key in INHERITED:
        value = spec[key] if spec.get(key) is not None else getattr(data, key)
        if isinstance(getattr(data, key), str) and not isinstance(value, str):
            raise ConfigError(f"{where}.{key} must be a string, got {value!r}")
        if isinstance(getattr(data, key), int) and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"{where}.{key} must be an integer >= 0, got {value!r}")
        out[key] = value
    return out


def _finite(w: Any) -> bool:
    return isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)


def check_domain_names(names: list[str] | tuple[str, ...], domains: list[Domain], where: str) -> None:
    """Refuse a name in ``names`` that is not a configured domain (a stage's domain, say)."""
    known = [d.name for d in domains]
    for n in names:
        if n not in known:
            valid = ", ".join(known) if known else "none: data.domains is empty"
            raise ConfigError(f"{where} names the domain {n!r}, which data.domains does not define; defined: {valid}")


class DomainReward:
    """A reward function that scores only its domain's completions and answers None (not applicable) for
    the others, so that the weighted sum of a completion is its own domain's. What it logs with
    ``log_metric(name, ...)`` becomes ``<domain>/<name>`` (a function two domains share is not pooled).
    A class, not a closure, so that it pickles into the reward workers when the function it wraps does."""

    def __init__(self, fn: Callable, domain: str):
        self.fn, self.domain = fn, domain
        self.__name__ = reward_name(fn)  # its function's one name (TRL's rule: a partial's function, an object's class)
        self.reads_group_size = passes_group_size(fn, "trl")  # passes group_size on where its function reads it

    def __call__(self, **kwargs: Any) -> list:
        tags = kwargs.get(COLUMN)
        n = len(kwargs["completions"])
        if tags is None:  # rows without a domain column (passed rows): nothing here is this domain's
            return [None] * n
        mine = [i for i, t in enumerate(tags) if t == self.domain]
        if not mine:
            return [None] * n
        inner = {k: v for k, v in kwargs.items() if k not in ("log_metric", "log_extra")}
        if len(mine) < n:  # the runner calls one group at a time, so this is a retried completion or a mix
            inner = {k: ([v[i] for i in mine] if isinstance(v, list) and len(v) == n else v) for k, v in inner.items()}
        values = call_reward(self.fn, inner)
        if values.broken:  # not one value per completion: the runner stops the run with what it returned
            return values
        log, extra = kwargs.get("log_metric"), kwargs.get("log_extra")
        for name, vals in values.metrics.items() if log is not None else ():
            for v in vals:
                log(f"{self.domain}/{name}", v)  # per domain, as its functions' rewards/<domain>/... metrics
        for column, vals in values.extra.items() if extra is not None else ():
            extra(column, _spread(vals, mine, n))  # one entry per completion of the call, None off the domain
        return _spread(values, mine, n)


def _spread(values: list, rows: list[int], n: int) -> list:
    """``values`` of ``rows`` placed in a list of ``n`` (None elsewhere)."""
    out: list = [None] * n
    for i, v in zip(rows, values):
        out[i] = v
    return out
