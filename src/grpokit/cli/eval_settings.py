"""What ``grpokit eval`` evaluates, how it grades and how it samples, each flag checked.

A run's checkpoint (``--model`` a run folder, one of its checkpoints or their model/ folder) is
evaluated as it was trained: the run's config.yaml (with its config_history.yaml) gives the data
section (task, dataset, prompt and answer columns, system prompt, chat template), the env section
(tools, environment), the grader and the sampling settings. The rows are those of the run's held-out
evaluation (data.eval_dataset, else the task's held-out set; a run on its own data without
data.eval_dataset gets its training data, with a warning), and so is the grader: the task's
verifier, else the first of reward.functions. A flag changes one of them: ``--task``, ``--dataset``,
``--split``, ``--reward`` (which then grades, on a task's rows too), ``--temperature`` ... Without a
run, the built-in arithmetic task and 16 new tokens at temperature 1.

The model section is not the run's: the checkpoint is the model, and how to load it (model.dtype,
model.device, model.trust_remote_code, model.attn_implementation) is eval's to choose. An override
(``section.field=value``) of a field eval does not read is refused in one sentence, naming the flag
that sets it where there is one (``rollout.temperature`` -> ``--temperature``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable

from grpokit.config.data_sources import READERS, unread_fields
from grpokit.config.io import apply_overrides
from grpokit.config.sections import Config, ConfigError, DataConfig, EnvConfig, RewardConfig, RolloutConfig
from grpokit.train.resume import CONFIG_FILE
from grpokit.validation import validate
from grpokit.validation.rollout import check_generation_kwargs, check_sampling

# a rollout field and eval's flag that sets it
SAMPLING_FLAGS = {
    "max_new_tokens": "--max-new-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "min_p": "--min-p",
    "repetition_penalty": "--repetition-penalty",
    "stop": "--stop",
    "generation_kwargs": "--generation-kwargs",
}
# fields eval sets by a flag of its own: an override of one is refused, naming the flag
FLAG_OF = {
    "model.name_or_path": "--model",
    "data.task": "--task",
    "data.dataset": "--dataset",
    "data.eval_dataset": "--dataset",
    "data.split": "--split",
    "data.eval_split": "--split",
    "data.eval_size": "--limit",
    "reward.functions": "--reward",
    "train.seed": "--seed",
    **{f"rollout.{name}": flag for name, flag in SAMPLING_FLAGS.items()},
}
# the fields eval reads from overrides (and, but for the model's, from the run)
READ = {
    "model": ("dtype", "device", "trust_remote_code", "attn_implementation"),
    "data": ("task_params", "prompt_column", "answer_column", "system_prompt", "chat_template", "chat_template_kwargs"),
    "env": tuple(f.name for f in dataclasses.fields(EnvConfig)),
    "reward": ("params", "convention"),
}
# the run's reward fields eval grades with (its grader, the grader's keyword arguments, what the grader receives);
# the others are training's (its judge, weights, workers ...), read by features eval does not run, and validation
# would refuse one beside eval's own algo section (reward.judge without dynamic sampling: a DAPO run's)
REWARD_FROM_RUN = ("functions", "params", "convention")
EVAL_DEFAULTS = {"max_new_tokens": 16}  # without a run: a short answer, the rest as training's defaults


@dataclasses.dataclass(frozen=True)
class Target:
    """What is evaluated, for the output: a task's held-out rows or a dataset's (split: None where a
    local file or folder has none), and the grader's name ("task": the task's verifier)."""

    task: str | None
    dataset: str | None
    split: str | None
    reward: str


def check_flags(args: argparse.Namespace) -> tuple[list[int], int]:
    """The counts and the choice of rows: one sentence for the first flag that is wrong. Returns the k of
    pass@k (``--k``) and the samples per prompt (``--samples``, default the largest k). Greedy decoding
    with k > 1 is refused by `sampling_settings`, on the settings used (a flag's or the run's)."""
    ks, n = _ks_and_samples(args)
    if args.limit < 0:
        raise ConfigError(f"--limit {args.limit} must be >= 0 (0 = all prompts)")
    if args.task and args.dataset:  # --task '' --dataset F: the old spelling of the dataset alone
        raise ConfigError(
            f"--task {args.task!r} and --dataset {args.dataset!r} both name the prompts to evaluate; give one"
        )
    if args.task == "" and not args.dataset:
        raise ConfigError("--task '' evaluates --dataset instead of a task, but no --dataset is given; give one")
    if len(args.reward) > 1:
        raise ConfigError(
            f"--reward is given {len(args.reward)} times ({', '.join(args.reward)}); one function grades, so give one"
        )
    return ks, n


def _ks_and_samples(args: argparse.Namespace) -> tuple[list[int], int]:
    """The k of pass@k (``--k``) and the samples per prompt (``--samples``, default the largest k)."""
    try:
        ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
    except ValueError:
        ks = []
    if not ks or ks[0] < 1:
        raise ConfigError(f"--k {args.k!r} must list positive integers, e.g. 1,4,8")
    if args.samples < 0:
        raise ConfigError(f"--samples {args.samples} must be >= 1, or 0 for the largest k")
    n = args.samples or ks[-1]
    if n < ks[-1]:
        raise ConfigError(f"--samples {n} is smaller than the largest k ({ks[-1]}); pass@k needs n >= k")
    return ks, n


def check_overrides(overrides: list[str]) -> None:
    """Refuse an override of a field eval does not read (after the usual checks of its name and value)."""
    apply_overrides(Config(), overrides)  # unknown names, wrong types: the config's own sentences
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        section, field = (key.split(".") + [""])[:2]
        if key in FLAG_OF or f"{section}.{field}" in FLAG_OF:
            flag = FLAG_OF.get(key) or FLAG_OF[f"{section}.{field}"]
            raise ConfigError(f"grpokit eval sets {section}.{field} with {flag}, not an override; give {flag} instead")
        if field not in READ.get(section, ()):
            reads = "; ".join(f"{s}.{{{', '.join(f for f in fs)}}}" for s, fs in READ.items() if s != "env")
            raise ConfigError(
                f"grpokit eval does not read {section}.{field} (it reads {reads}; env.*; and its own flags, see "
                "grpokit eval --help); leave the override out"
            )


def run_of(model_dir: str | Path) -> Path | None:
    """The run folder whose checkpoint ``model_dir`` is (``run/checkpoints/step-N`` or its model/), or None."""
    for folder in Path(model_dir).parents[:2]:
        if folder.name == "checkpoints" and (folder.parent / CONFIG_FILE).is_file():
            return folder.parent
    return None


def eval_config(args: argparse.Namespace, model: str, run: Path | None) -> tuple[Config, RolloutConfig, Target]:
    """The validated config of evaluating ``model`` (the run's data and env sections and its grader's reward fields,
    REWARD_FROM_RUN, or the defaults; flags, then overrides, on top), eval's sampling settings and what is
    evaluated."""
    from grpokit.train.resume import load_run_config

    check_overrides(args.overrides)
    trained = load_run_config(run, doing="evaluating it") if run is not None else Config()
    cfg = Config()
    cfg.data, cfg.env = trained.data, trained.env
    cfg.reward = RewardConfig(**{name: getattr(trained.reward, name) for name in REWARD_FROM_RUN})
    source, split = _choose_rows(cfg, args, run)
    _check_row_overrides(args.overrides, cfg.data, source)
    if args.reward:  # the given function grades (on a task's rows too), with its reward.params if any
        name = args.reward[0]
        cfg.reward.functions, cfg.reward.weights = [name], []
        cfg.reward.params = {name: cfg.reward.params[name]} if name in cfg.reward.params else {}
    apply_overrides(cfg, args.overrides)
    cfg.model.name_or_path = model
    validate(cfg)
    from grpokit.train import run_data

    run_data.use_task_model(cfg)  # --task calculator --model demo: the task's own checkpoint
    sampling = sampling_settings(args, trained.rollout if run is not None else None)
    cfg.rollout = sampling  # overlong_penalty's window follows the generation length, as in training
    task = run_data.task_of(cfg)
    grader = "task" if task is not None and not args.reward else (cfg.reward.functions or [""])[0]
    if grader == "task" and any(o.startswith("reward.params") for o in args.overrides):
        raise ConfigError("reward.params is not read: the task's verifier grades; leave it out, or give --reward")
    return cfg, sampling, Target(task=task.name if task else None, dataset=source, split=split or None, reward=grader)


def _choose_rows(cfg: Config, args: argparse.Namespace, run: Path | None) -> tuple[str | None, str]:
    """Set cfg.data.task / cfg.data.dataset for the rows evaluated: (the dataset read, its split), or
    (None, "") for a task's held-out rows. As training's held-out evaluation: data.eval_dataset, else
    the task's held-out set; eval adds --task, --dataset and the run's own training data."""
    d = cfg.data
    if args.task is not None and args.task != d.task:
        d.task_params = {}  # another task's parameters
    if args.task:
        d.task, d.dataset, d.eval_dataset = args.task, "", ""
    source, split = None, args.split
    if args.dataset:
        d.task, d.dataset, source, split = "", args.dataset, args.dataset, args.split or "test"
    elif args.task is None and d.eval_dataset:
        d.task, d.dataset, source, split = "", d.eval_dataset, d.eval_dataset, args.split or d.eval_split
    elif args.task is None and d.dataset:
        source, split = d.dataset, args.split or d.split
        print(
            f"grpokit: warning: the run {run} has no held-out set (data.eval_dataset is empty), so its training data "
            f"{source} is evaluated; give --dataset FILE to evaluate other rows",
            file=sys.stderr,
            flush=True,
        )
    elif not d.task:
        raise ConfigError(
            f"the run {run} trained on data.domains, which grpokit eval does not evaluate as one; give --task NAME, "
            "or --dataset FILE with --reward, for each domain"
        )
    for name in unread_fields(d):  # the run's settings of rows not evaluated (its data.split beside --task ...)
        setattr(d, name, getattr(DataConfig(), name))
    if source is None and args.split is not None:
        raise ConfigError(
            f"--split {args.split!r} picks a split of --dataset, but the task {d.task!r} is evaluated on its own "
            "held-out rows; leave --split out"
        )
    return source, split


def _check_row_overrides(overrides: list[str], d: DataConfig, source: str | None) -> None:
    """An override of a data.* field that no source of the evaluated rows reads is refused: config/data_sources.py's
    SOURCE_FIELDS, the table training's validation and the presets read, decides (data.task_params is a task's,
    the column names a dataset's). ``d``: the data section as ``_choose_rows`` left it; ``source``: the dataset
    evaluated, None for a task's held-out rows."""
    unread = unread_fields(d)
    rows = f"the dataset {source}" if source is not None else f"the held-out rows of the task {d.task!r}"
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        section, field = (key.split(".") + [""])[:2]
        if section == "data" and field in unread:
            readers = " or ".join(READERS[r] for r in unread[field])
            raise ConfigError(f"{key} is read only with {readers}, but grpokit eval evaluates {rows}; leave it out")


def sampling_settings(args: argparse.Namespace, trained: RolloutConfig | None) -> RolloutConfig:
    """The sampling settings: each flag given, else the run's (as trained), else eval's defaults;
    checked with training's rules, except that temperature 0 (greedy) is valid, for --k 1 only. The decode
    loop is the run's too (rollout.engine), with its generation_kwargs (transformers' generate(): beams,
    no_repeat_ngram_size ...), unless --generation-kwargs gives others ('{}': none, grpokit's own loop)."""
    base = trained if trained is not None else RolloutConfig(**EVAL_DEFAULTS)
    values = {name: getattr(base, name) for name in SAMPLING_FLAGS}
    given = {name: getattr(args, name) for name in SAMPLING_FLAGS if getattr(args, name) is not None}
    if "generation_kwargs" in given:
        given["generation_kwargs"] = _json_object(given["generation_kwargs"])
        check_generation_kwargs(given["generation_kwargs"], "--generation-kwargs")
    kwargs = given.get("generation_kwargs", base.generation_kwargs)
    # generate()'s settings need its engine; '{}' drops them: grpokit's own loop, the run's decoder where it had one
    engine = (
        "generate" if kwargs else "auto" if "generation_kwargs" in given and base.engine == "generate" else base.engine
    )
    r = RolloutConfig(**{**values, **given}, engine=engine)

    def said(name: str, value: Any) -> str:
        if name in given:
            return f"{SAMPLING_FLAGS[name]} {value}"
        return f"the run's rollout.{name}={value}" if trained is not None else f"{SAMPLING_FLAGS[name]} {value}"

    check_sampling(r, said, greedy=True)
    _refuse_greedy_repeats(r, args, said, given)
    if any(not s for s in r.stop):
        raise ConfigError("--stop '' is empty, so every completion would stop at once; give the text that ends one")
    return r


def _json_object(text: str) -> dict:
    """``--generation-kwargs``' JSON object, or one sentence."""
    import json

    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(
            f"--generation-kwargs {text!r} is not a JSON object; give one, e.g. '{{\"no_repeat_ngram_size\": 3}}', "
            "or '{}' for none"
        )
    return value


def _refuse_greedy_repeats(
    r: RolloutConfig, args: argparse.Namespace, said: Callable[[str, Any], str], given: dict[str, Any]
) -> None:
    """Greedy decoding (temperature 0 or top-k 1, from a flag or from the run) draws one completion: k > 1
    samples of it would be counted as independent draws in pass@k and maj@k."""
    k = _ks_and_samples(args)[0][-1]
    name = "temperature" if r.temperature == 0 else "top_k" if r.top_k == 1 else None
    if k > 1 and name is None and r.generation_kwargs.get("do_sample", True) is False:
        kwargs = said("generation_kwargs", r.generation_kwargs)
        raise ConfigError(
            f"{kwargs} decodes without sampling (do_sample false), so the {k} samples of --k {args.k} would be one "
            "completion repeated, not independent draws; give --k 1, or --generation-kwargs without do_sample"
        )
    if k == 1 or name is None:
        return
    greedy = said(name, 0 if name == "temperature" else 1)  # "--top-k 1", or "the run's rollout.top_k=1"
    if name in given:
        sample = f"leave {greedy} out (sampling as the run did, else at temperature 1)"
    else:  # the run's own setting: a flag that samples
        sample = f"give {SAMPLING_FLAGS[name]} {'1' if name == 'temperature' else '0'}"
    raise ConfigError(
        f"{greedy} decodes greedily, so the {k} samples of --k {args.k} would be one completion repeated, not "
        f"independent draws; give --k 1 for greedy accuracy, or {sample} for pass@k and maj@k with k > 1"
    )


def grader(cfg: Config, explicit: bool) -> Callable:
    """The function that grades: the task's verifier (unless ``--reward`` was given), else the first of
    reward.functions with its reward.params, as training's held-out evaluation grades."""
    from grpokit.rewards.spec import RewardError, resolve_reward
    from grpokit.train import run_data
    from grpokit.train.reward_setup import check_reward_params, reward_params

    task = run_data.task_of(cfg)
    name = cfg.reward.functions[0] if cfg.reward.functions else "task"
    if task is not None and (name == "task" or not explicit):
        return task.reward_fn
    if name == "task":
        raise ConfigError(
            f"--dataset {cfg.data.dataset} needs a --reward to grade its completions (a built-in name such as "
            "math_accuracy, or module:function)"
        )
    try:
        fn = resolve_reward(name, **reward_params(cfg, name))
    except RewardError as e:
        raise ConfigError(f"the grading function: {e}") from None
    check_reward_params(name, fn, cfg.reward.params.get(name, {}))
    return fn
