"""Presets: the published hyperparameters of each recipe, as YAML files beside this module.

A preset is a partial config (sections as mappings, as in a ``--config`` file). Applying it to a
config fills the fields nobody set (``config_io.assigned``): a user's ``--config`` file and overrides
always win, whatever order they are given in. Two rules make a preset fit the run it is applied to:

* Paper scale. ``train.prompts_per_step``, ``rollout.max_new_tokens`` and ``optim.lr`` are what the
  paper ran on its model and cluster (DAPO: 512 prompts x 16 completions of up to 20,480 tokens);
  they are kept out unless asked for (``paper_scale=True``, ``grpokit train --paper-scale``), so the
  run keeps its own batch, generation length and learning rate (the demo's, or Config()'s). Other
  fields (group size, clipping, aggregation, KL, rewards ...) are the recipe and always apply.
  Length shaping follows the run: overlong_penalty's window is derived from rollout.max_new_tokens
  (each stage's under train.stages).
* "task" in a preset's ``reward.functions`` stands for the run's own reward: when the user named
  reward functions, they take its place (weights multiplied by the preset's weight for "task"), so
  DAPO on one's own data is the user's reward plus the overlong penalty; "task" in the preset's
  reward.judge becomes the user's functions too (without any, the functions passed to the
  Trainer, which take "task"'s place when the run has no task).
* A preset made for this scale of machine (``scale: own`` at the top of its file: smollm2-math)
  is not a paper's: its batch, generation length and learning rate always apply.
* A preset fills a feature's settings only where the run has the feature on (``unread``): TRL's
  ``kl_bias_correction`` and ``entropy_aggregation`` (trl-default) apply once algo.beta > 0 or an
  entropy bonus is given, RLOO's KL in the reward only with its beta. What a registered stage reads is known
  above this package: ``apply(..., rules=grpokit.validation.unread_rules())`` (as the command line calls it)
  adds the objectives' rules, so DAPO's clip range is left out under algo.objective=sapo or vespo (and
  GSPO's clip_low under cispo, which reads only clip_high). A run with data.domains
  gets none of the data fields its domains own (smollm2-math's data.task and data.task_params): each
  domain has its own, and the run's would be refused beside them. A run on an optimizer that does not read
  the Adam settings (sgd, adafactor ...) gets none of them (trl-default's optim.adam_beta2).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

from grpokit.config.algo import UNREAD_UNLESS, Unread
from grpokit.config.data_sources import unread_fields
from grpokit.config.io import assigned, set_field, strict_yaml
from grpokit.config.judge import judge_readers
from grpokit.config.optim import unread_optimizer_fields
from grpokit.config.sections import Config, ConfigError, beside_domains

HERE = Path(__file__).parent
PAPER_SCALE = ("train.prompts_per_step", "rollout.max_new_tokens", "optim.lr")
"""Fields that depend on the model and hardware a paper used rather than on its algorithm."""


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def load(name: str) -> dict[str, Any]:
    path = HERE / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; valid presets: {', '.join(names())}")
    data = strict_yaml(path.read_text(), f"preset file {str(path)!r}") or {}
    data.pop("scale", None) if isinstance(data, dict) else None  # read by own_scale()
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(f"preset file {str(path)!r} must map config sections to mappings of fields")
    return data


def own_scale(name: str) -> bool:
    """True for a preset written for this scale of machine (``scale: own``, e.g. smollm2-math): its batch,
    generation length and learning rate are its recipe, applied without --paper-scale."""
    path = HERE / f"{name}.yaml"
    data = strict_yaml(path.read_text(), f"preset file {str(path)!r}") or {}
    return isinstance(data, dict) and data.get("scale") == "own"


def description(name: str) -> str:
    """The comment lines at the top of the preset file."""
    lines = (HERE / f"{name}.yaml").read_text().splitlines()
    return " ".join(l.lstrip("# ").strip() for l in lines if l.startswith("#"))


def split(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A preset's fields as dotted names: (the recipe, the paper-scale fields)."""
    flat = {f"{section}.{key}": v for section, fields in values.items() for key, v in fields.items()}
    return (
        {k: v for k, v in flat.items() if k not in PAPER_SCALE},
        {k: v for k, v in flat.items() if k in PAPER_SCALE},
    )


def plan(name: str, cfg: Config, paper_scale: bool = False, rules: Sequence[Unread] = UNREAD_UNLESS) -> dict[str, Any]:
    """The fields ``apply`` fills in ``cfg`` and their values, in the preset's order: the preset's fields that were
    not assigned (the paper-scale ones only with ``paper_scale``), "task" in its reward lists replaced by the user's
    functions, reward.params merged per function, and none that ``rules`` say the filled run would not read. The
    one account of what a preset fills: ``apply`` sets it at a run's start, ``resumed`` holds a run to it."""
    recipe, paper = split(load(name))
    values = {**recipe, **(paper if paper_scale or own_scale(name) else {})}
    given = assigned(cfg)
    own = list(cfg.reward.functions) if "reward.functions" in given else None
    if own is not None and "task" in (values.get("reward.functions") or []):
        values["reward.functions"], values["reward.weights"] = _merge_rewards(
            values["reward.functions"], values.get("reward.weights") or [], own, list(cfg.reward.weights)
        )
        if own and "reward.judge" in values:  # "task" there: the same functions as in reward.functions
            judge = values["reward.judge"]
            values["reward.judge"] = list(dict.fromkeys(n for x in judge for n in (own if x == "task" else [x])))
        given = given - {"reward.functions", "reward.weights"}
    fill = {key: value for key, value in values.items() if key not in given}
    if "reward.params" in given and "reward.params" in values:  # per-function mappings: the user's win per function
        fill["reward.params"] = {**(values["reward.params"] or {}), **cfg.reward.params}
    for key in unread(fill, cfg, rules):  # a feature the run leaves off (algo.beta=0: the KL's estimator ...)
        del fill[key]
    return fill


def apply(
    name: str, cfg: Config | None = None, paper_scale: bool = False, rules: Sequence[Unread] = UNREAD_UNLESS
) -> Config:
    """Fill the fields of ``cfg`` (default: a fresh Config) that were not assigned with the preset's
    values; the paper-scale fields only when ``paper_scale``; none that ``rules`` say the filled run would not
    read (``grpokit.validation.unread_rules()`` adds the registered objectives' to config/algo.py's): ``plan``'s
    fields. See the module docstring."""
    cfg = cfg if cfg is not None else Config()
    for key, value in plan(name, cfg, paper_scale, rules).items():
        set_field(cfg, key, value)
    return cfg


def unread(fields: dict[str, Any], cfg: Config, rules: Sequence[Unread] = UNREAD_UNLESS) -> list[str]:
    """The dotted names among ``fields`` (a preset's values about to fill ``cfg``) that no feature of the filled
    run would read (``rules``, config/algo.py's ``UNREAD_UNLESS`` by default: the KL's settings with algo.beta=0,
    the entropy bonus's with none ...; validation's ``unread_rules()`` adds a clip range under
    algo.objective=sapo ...): a preset fills the settings of the features it turns on, or the user does, and no
    other, so ``--preset trl-default`` keeps TRL's KL settings for a run given algo.beta > 0 and adds none to one
    without a KL term (a value the user gives such a field is still refused by validation). Likewise a run with
    data.domains gets no data.task, data.task_params ... (smollm2-math's): its domains have their own
    (config/sections.py BESIDE_DOMAINS "own"); a run on data.dataset gets none of a task's (nor the data.task its
    rows replace), a run on a task no data.split (config/data_sources.py), a run without held-out rows no
    train.eval_every, a run where nothing judges completions (config/judge.py judge_readers) no reward.judge, and a
    run on sgd, adafactor ... no optim.adam_beta2 (config/optim.py OPTIMIZER_FIELDS)."""
    trial = copy.deepcopy(cfg)
    for key, value in fields.items():
        set_field(trial, key, value)
    off = {f"algo.{name}" for rule in rules if not rule.on(trial.algo) for name in rule.fields}
    if trial.data.domains:  # each domain has its own task, task_params ...: the run's would be refused beside them
        off |= {f"data.{name}" for name in beside_domains("own")}
    off |= {f"data.{name}" for name in unread_fields(trial.data)}  # a source the run does not use (data_sources.py)
    if trial.data.dataset:  # one's own data replaces the task (train/run_data.py refuses one chosen beside it)
        off.add("data.task")
    if not judge_readers(trial):  # no dynamic sampling, frontier curriculum or error correction judges
        off.add("reward.judge")
    if (trial.data.dataset and not trial.data.eval_dataset) or trial.data.eval_size == 0:
        off.add("train.eval_every")  # no held-out rows to evaluate (train/run_data.py refuse_idle_evaluation)
    off |= {f"optim.{name}" for name in unread_optimizer_fields(trial.optim.optimizer, trial.algo.aggregation)}
    return [key for key in fields if key in off]


def resumed(
    name: str, run: Config, fresh: Config, paper_scale: bool = False, rules: Sequence[Unread] = UNREAD_UNLESS
) -> Config:
    """``run`` (a resumed run's config) under ``--preset name`` and this command line: a preset fills a run's
    fields at its start, so here it is accepted only where it changes nothing. ``fresh`` is the config this
    command line would start a new run with before the preset (its ``--config`` and overrides); every field the
    preset would then fill (``plan``, what ``apply`` fills) must already hold that value in ``run``, as it does
    when the job that started the run passes the same line on every start. Otherwise one sentence: applying the
    preset now would change the run's recipe in the middle (or half of it, as the fields the run's config.yaml
    holds). The fields the line gives take the values a start would give them (the user's reward functions
    beside the preset's)."""
    given = assigned(fresh)
    fill = plan(name, fresh, paper_scale, rules)
    started = copy.deepcopy(fresh)
    for key, value in fill.items():
        set_field(started, key, value)
    replaced = {f"data.{n}" for n in beside_domains("own")} if run.data.domains else set()  # a start fills none
    keys = [k for k in fill if k not in given | replaced]
    keys += ["reward.weights"] * ("reward.functions" in keys and "reward.weights" not in keys)
    differ = [k for k in keys if _value(run, k) != _value(started, k)]
    if differ:
        shown = ", ".join(f"{k}={_value(run, k)!r} (the preset: {_value(started, k)!r})" for k in differ[:4])
        raise ConfigError(
            f"--preset {name} with --resume of a run whose config differs from it: {shown}"
            f"{' ...' if len(differ) > 4 else ''}; a preset applies at a run's start, so drop --preset (the run "
            "keeps its own config), give the fields to change as overrides (kept in config_history.yaml), or start "
            "a new run"
        )
    for k in given | ({"reward.weights"} if "reward.functions" in given else set()):
        set_field(run, k, _value(started, k))
    return run


def _value(cfg: Config, dotted: str) -> Any:
    section, field = dotted.split(".", 1)
    return getattr(getattr(cfg, section), field)


def _merge_rewards(
    preset: list[str], preset_w: list[float], own: list[str], own_w: list[float]
) -> tuple[list[str], list[float]]:
    """The preset's reward list with "task" replaced by the user's functions; a user function's
    weight is its own weight (default 1) times the preset's weight for "task"."""
    preset_w = [float(w) for w in preset_w] or [1.0] * len(preset)
    own_w = [float(w) for w in own_w] or [1.0] * len(own)
    if len(preset_w) != len(preset) or len(own_w) != len(own):
        raise ConfigError(
            f"reward.weights must have one entry per reward function; the preset has {preset} with "
            f"{preset_w} and the run {own} with {own_w}"
        )
    names, weights = [], []
    for fn, w in zip(preset, preset_w):
        if fn == "task":
            names += own
            weights += [w * v for v in own_w]
        else:
            names.append(fn)
            weights.append(w)
    return names, weights
