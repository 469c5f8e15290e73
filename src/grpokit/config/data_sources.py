"""Which data.* fields each source of a run's rows reads, one table (``SOURCE_FIELDS``).

A run without data.domains trains on one source: the built-in task (data.task), one's own file or hub
dataset (data.dataset, which replaces the task), or rows passed to the Trainer (``Trainer(train_rows=...)``,
grpokit.trl's dataset: data.task cleared, nothing configured read); and it evaluates on data.eval_dataset
when set, else on the task's held-out split (train/run_data.py ``data_rows`` reads them so). A field that
only unused sources read would change nothing: validation refuses it set away from its default
(validation/model.py), a preset fills none of them (config/presets), and ``grpokit eval`` drops those of
the rows it does not evaluate. With data.domains, config/sections.py's BESIDE_DOMAINS rules instead.
"""

from __future__ import annotations

from typing import Any

SOURCE_FIELDS: dict[str, tuple[str, ...]] = {
    "task": ("task_params",),  # the task's generator (its rows and its held-out split)
    "dataset": ("split", "prompt_column", "answer_column"),  # load_rows(data.dataset, data.split, ...)
    "eval_dataset": ("eval_split", "prompt_column", "answer_column"),  # load_rows(data.eval_dataset, ...)
}
"""Each source -> the data.* fields it alone reads (a field two sources read is read while either is used)."""

READERS = {
    "task": "a built-in task (data.task, with data.dataset empty)",
    "dataset": "data.dataset",
    "eval_dataset": "data.eval_dataset",
}
"""How a sentence names each source as the reader of a field."""


def sources(d: Any) -> tuple[str, ...]:
    """The sources a ``DataConfig`` uses: "dataset" (data.dataset set) or "task" (data.task set without it),
    none for rows passed to the Trainer; and "eval_dataset" when set. None at all with data.domains."""
    if d.domains:
        return ()
    train = ("dataset",) if d.dataset else ("task",) if d.task else ()
    return train + (("eval_dataset",) if d.eval_dataset else ())


def unread_fields(d: Any) -> dict[str, tuple[str, ...]]:
    """The data.* fields no source of ``d`` reads, each with the sources that would: ``{"split": ("dataset",)}``
    for a built-in task's run. Empty with data.domains (BESIDE_DOMAINS governs those)."""
    if d.domains:
        return {}
    used = sources(d)
    read = {name for source in used for name in SOURCE_FIELDS[source]}
    out: dict[str, tuple[str, ...]] = {}
    for source, names in SOURCE_FIELDS.items():
        for name in names:
            if name not in read:
                out[name] = out.get(name, ()) + (source,)
    return out


def rows_in_use(d: Any) -> str:
    """The run's rows in words: "the built-in task 'arithmetic'", "data.dataset='train.jsonl'", or the rows
    passed to the Trainer."""
    if d.dataset:
        return f"data.dataset={d.dataset!r}"
    return f"the built-in task {d.task!r}" if d.task else "the rows passed to the Trainer"
