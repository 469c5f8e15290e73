"""What a run trains on: the built-in task or one's own data (and the demo settings a task brings),
the training and held-out rows, and the gold answers checked at load time.
"""

from __future__ import annotations

from grpokit.config.sections import Config, ConfigError, DataConfig
from grpokit.data.prompts import load_rows

TASK_TRAIN_ROWS = 8192  # rows drawn from a built-in task's training split (the sampler cycles them)


def task_of(cfg: Config):
    """The built-in task of this run, or None when the run brings its own data (data.dataset)."""
    from grpokit.data.tasks import get_task

    return get_task(cfg.data.task, cfg.data.task_params) if cfg.data.task and not cfg.data.dataset else None


def resolve_run(cfg: Config, own_rows: bool = False) -> Config:
    """Settle what depends on the run, in place: one's own data (``data.dataset``, or rows passed to
    the Trainer: ``own_rows``) replaces the built-in task, its reward and its held-out set
    (data.task becomes ""); the demo (a task on its own demo model) fills the fields nobody set with
    the task's demo settings; model.name_or_path=demo becomes the task's own checkpoint (the
    calculator task ships one that knows the tool tags), which config.yaml then records."""
    from grpokit.config.io import assigned, set_field

    if cfg.data.dataset or own_rows:
        refuse_replaced_task(cfg.data)
        cfg.data.task = ""
    task = task_of(cfg)
    if task is None or cfg.model.name_or_path != "demo":
        return cfg
    given = assigned(cfg)
    for name, value in task.demo.items():
        if name not in given:
            set_field(cfg, name, value)
    if task.name != "arithmetic":
        cfg.model.name_or_path = str(task.model_path())
    return cfg


def refuse_replaced_task(d: DataConfig) -> None:
    """One's own rows replace the task: a task chosen beside them (not the default, which nobody chose) would be
    dropped unseen, its rows, reward and held-out set with it."""
    if d.task and d.task != DataConfig().task:
        rows = f"data.dataset={d.dataset!r}" if d.dataset else "the rows passed to the Trainer"
        raise ConfigError(
            f"data.task={d.task!r} has no effect with {rows}, which replace the task's rows, reward and held-out "
            "set; leave data.task out, or data.dataset empty to train on the task"
        )


def use_task_model(cfg: Config) -> None:
    """model.name_or_path=demo means the built-in task's own checkpoint (for ``grpokit eval``)."""
    task = task_of(cfg)
    if task is not None and cfg.model.name_or_path == "demo" and task.name != "arithmetic":
        cfg.model.name_or_path = str(task.model_path())


def data_rows(
    cfg: Config, train_rows: list[dict] | None, eval_rows: list[dict] | None
) -> tuple[list[dict], list[dict]]:
    """Training and held-out rows: given ones, else the built-in task's, else the configured files.
    One's own data is evaluated on data.eval_dataset (or given eval_rows) or not at all, never on the
    task's held-out set."""
    d = cfg.data
    task = task_of(cfg) if train_rows is None else None
    if train_rows is None:
        if not (task or d.dataset):
            raise ConfigError(
                "data.task and data.dataset are both empty; set one (e.g. data.task=arithmetic or "
                "data.dataset=train.jsonl)"
            )
        train_rows = (
            task.train_rows(TASK_TRAIN_ROWS, seed=cfg.train.seed)
            if task
            else load_rows(d.dataset, d.split, d, "data.split", DataConfig().split)
        )
    if eval_rows is None:
        if d.eval_dataset:
            eval_rows = load_rows(d.eval_dataset, d.eval_split, d, "data.eval_split", DataConfig().eval_split)
        else:
            eval_rows = task.held_out_rows(d.eval_size) if task else []
    return train_rows, eval_rows[: d.eval_size]


def refuse_idle_evaluation(cfg: Config, eval_rows: list) -> None:
    """train.eval_every > 0 with no held-out rows would evaluate nothing (summary.json's eval_before and
    eval_after empty too): one's own data without data.eval_dataset (or eval rows), or data.eval_size=0."""
    n = cfg.train.eval_every
    if eval_rows or not n:
        return
    why = "data.eval_size=0" if cfg.data.eval_size == 0 else "one's own data evaluates only data.eval_dataset"
    raise ConfigError(
        f"train.eval_every={n} evaluates nothing: the run has no held-out rows ({why}); set data.eval_dataset "
        "(or pass eval rows) and data.eval_size > 0, or leave train.eval_every 0"
    )


def check_gold_answers(cfg: Config, rows: list[dict], held_out: bool = False) -> None:
    """With math_accuracy, parse every gold answer at load time, training and held-out (``held_out``)
    alike: a gold that does not parse is reported (math_accuracy answers None for it: training skips
    it, held-out accuracy leaves its prompt out and counts it as ``ungraded``), never silently scored;
    a set with no gold that parses is refused."""
    if "math_accuracy" not in cfg.reward.functions or not rows:
        return
    from grpokit.rewards.math import validate_gold_answers  # lazy: sympy only for math_accuracy runs

    report = validate_gold_answers([r.get("answer") for r in rows])
    which = "held-out " if held_out else ""
    if report.num_valid == 0:
        raise ConfigError(
            f"math_accuracy: none of the {len(rows)} {which}gold answers parses ({report.message()}); "
            "check data.answer_column" + (" and data.eval_dataset" if held_out else "")
        )
    if report.invalid:
        where = "held-out data: " if held_out else ""
        print(f"grpokit: warning: {where}{report.message()}", flush=True)
