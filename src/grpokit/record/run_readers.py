"""Any GRPO run as a ``Run`` the doctor can read: a grpokit run folder, a TRL / transformers
``output_dir`` (``trainer_state.json``'s ``log_history``), TensorBoard event files, and JSONL / CSV
exports (W&B's table export, MLflow's metric export, verl's file logger).

Other trainers name the same quantities differently; ``canonical`` maps their names onto grpokit's
(which follow TRL's where the concept is the same, so TRL's names mostly map to themselves):

    grpokit / TRL             verl                                   OpenRLHF
    reward                    critic/score/mean                      reward
    completions/reward_max    critic/score/max
    completions/reward_min    critic/score/min
    kl                        actor/kl_loss                          kl
    entropy                   actor/entropy                          entropy
    clip_ratio/region_mean    actor/pg_clipfrac                      ppo_clip_ratio
    grad_norm                 actor/grad_norm                        raw_grad_norm, grad_norm
    loss                      actor/pg_loss                          policy_loss
    learning_rate             actor/lr                               actor_lr
    completions/mean_length   response_length/mean                  response_length
    completions/clipped_ratio response_length/clip_ratio
    time/step, time/rollout   timing_s/step, timing_s/gen
    eval/accuracy             val-core/*/acc/mean@*, val/test_score/*  eval/*pass1

A logger's namespace prefix (``train/`` from transformers' TensorBoard and W&B callbacks and from
OpenRLHF) is dropped first. TRL's ``eval_reward`` (its held-out mean reward) stands in for held-out
accuracy: with a 0/1 accuracy reward they are the same number. Names not in the table keep their own.
"""

from __future__ import annotations

import csv
import fnmatch
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from grpokit.config.sections import ConfigError

from .report_data import Run, load_run

NAMES = {
    # verl
    "critic/score/mean": "reward",
    "critic/score/max": "completions/reward_max",
    "critic/score/min": "completions/reward_min",
    "actor/kl_loss": "kl",
    "actor/entropy": "entropy",
    "actor/pg_clipfrac": "clip_ratio/region_mean",
    "actor/grad_norm": "grad_norm",
    "actor/pg_loss": "loss",
    "actor/lr": "learning_rate",
    "response_length/mean": "completions/mean_length",
    "response_length/max": "completions/max_length",
    "response_length/min": "completions/min_length",
    "response_length/clip_ratio": "completions/clipped_ratio",
    "timing_s/step": "time/step",
    "timing_s/gen": "time/rollout",
    "timing_s/reward": "time/reward",
    # OpenRLHF
    "policy_loss": "loss",
    "actor_lr": "learning_rate",
    "raw_grad_norm": "grad_norm",
    "response_length": "completions/mean_length",
    "ppo_clip_ratio": "clip_ratio/region_mean",
    # TRL's evaluation rows (log_history) and the transformers trainer's step time
    "eval_reward": "eval/accuracy",
    "step_time": "time/step",
}
HELDOUT_PATTERNS = ("val-core/*/acc/mean@*", "val-core/*/reward/mean@*", "val/test_score/*", "eval/*pass1")
STEP_KEYS = ("step", "_step", "global_step", "train/global_step", "training/global_step", "Step")
PREFIXES = ("train/", "training/")


def canonical(name: str) -> str:
    """grpokit's name for another trainer's metric name (itself when unknown)."""
    for p in PREFIXES:
        if name.startswith(p) and name not in NAMES:
            name = name[len(p) :]
            break
    if name in NAMES:
        return NAMES[name]
    if any(fnmatch.fnmatchcase(name, p) for p in HELDOUT_PATTERNS):
        return "eval/accuracy"
    return name


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f  # NaN and inf are kept: a non-finite loss is evidence


Point = tuple[int, str, float]  # (step, name as logged, value)


def rows_by_step(segments: Iterable[Sequence[Point]]) -> list[dict[str, Any]]:
    """Metrics rows (one per step, ascending) from the points of a source in the segments it was written in, oldest
    first: one logged row each (a JSONL line, a CSV row, a log_history entry), or one TensorBoard event file (a
    session). Names are made canonical. Within a segment the first value of a name at a step wins (a prefixed
    alias never overrides the metric itself). A segment that logs a name at or before a step where that name was
    already logged is a resumed session: what was logged before it from its first step on was abandoned with the
    session that logged it, and is dropped, so the later session's values stand (a run that went NaN at steps
    6-10 and was resumed clean from step 5 reads clean)."""
    rows: dict[int, dict[str, Any]] = {}
    for segment in segments:
        points = [(step, canonical(name), value) for step, name, value in segment]
        if not points:
            continue
        start, names = min(p[0] for p in points), {p[1] for p in points}
        if any(step >= start and not names.isdisjoint(row) for step, row in rows.items()):
            rows = {step: row for step, row in rows.items() if step < start}
        here: dict[int, dict[str, float]] = {}
        for step, name, value in points:
            here.setdefault(step, {}).setdefault(name, value)
        for step, values in here.items():
            rows.setdefault(step, {"step": step}).update(values)
    return [rows[s] for s in sorted(rows)]


def _flat_row(obj: dict[str, Any]) -> tuple[int | None, list[tuple[str, float]]]:
    data = obj.get("data") if isinstance(obj.get("data"), dict) else obj  # verl's file logger nests its metrics
    step = next((int(v) for k in STEP_KEYS if (v := _number(obj.get(k, data.get(k)))) is not None), None)
    pairs = [(k, f) for k, v in data.items() if k not in STEP_KEYS and (f := _number(v)) is not None]
    return step, pairs


def read_trainer_state(path: Path) -> list[dict[str, Any]]:
    """transformers' trainer_state.json: `log_history` rows carry `step` and the logged metrics."""
    state = json.loads(path.read_text(encoding="utf-8"))
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise ConfigError(f"{str(path)!r} has no log_history list; give the trainer_state.json a Trainer wrote")
    entries = []
    for obj in history:
        step, pairs = _flat_row(obj) if isinstance(obj, dict) else (None, [])
        entries.append([(step, k, v) for k, v in pairs if k != "epoch"] if step is not None else [])
    return rows_by_step(entries)


def read_jsonl_export(path: Path) -> list[dict[str, Any]]:
    lines = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a running export
        if isinstance(obj, dict):
            step, pairs = _flat_row(obj)
            lines.append([(n + 1 if step is None else step, k, v) for k, v in pairs])
    return rows_by_step(lines)


def read_csv_export(path: Path) -> list[dict[str, Any]]:
    """A wide table (W&B: one column per metric, a step column) or MLflow's long one (key, value, step)."""
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        table = list(csv.DictReader(f))
    if not table:
        return []
    cols = set(table[0])
    if {"key", "value", "step"} <= cols:  # each metric's history in turn: its own restarts, read per metric
        per_key: dict[str, list[list[Point]]] = {}
        for r in table:
            if (v := _number(r["value"])) is not None:
                per_key.setdefault(r["key"], []).append([(int(float(r["step"])), r["key"], v)])
        return _merged([rows_by_step(rows) for rows in per_key.values()])
    step_col = next((k for k in STEP_KEYS if k in cols), None)
    segments = []
    for i, r in enumerate(table):
        step = int(float(r[step_col])) if step_col and _number(r.get(step_col)) is not None else i + 1
        segments.append(
            [
                (step, k, v)
                for k, raw in r.items()
                if k != step_col and k and not k.endswith(("__MIN", "__MAX")) and (v := _number(raw)) is not None
            ]
        )
    return rows_by_step(segments)


def _merged(sources: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows of several metrics' histories joined by step; of two that give one name, the first listed."""
    rows: dict[int, dict[str, Any]] = {}
    for source in sources:
        for row in source:
            merged = rows.setdefault(row["step"], {"step": row["step"]})
            for k, v in row.items():
                merged.setdefault(k, v)
    return [rows[s] for s in sorted(rows)]


def read_tensorboard(paths: list[Path]) -> list[dict[str, Any]]:
    """Event files, each one session, read oldest first (by the time in their names), so that a resumed session's
    values replace what the one before logged from its restart on (`rows_by_step`), whether or not it marked the
    restart for TensorBoard (transformers' TensorBoardCallback does not)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sessions = []
    for p in sorted(paths, key=_written_at):
        acc = EventAccumulator(str(p), size_guidance={"scalars": 0})
        acc.Reload()
        sessions.append(
            [(int(e.step), tag, float(e.value)) for tag in acc.Tags().get("scalars", []) for e in acc.Scalars(tag)]
        )
    return rows_by_step(sessions)


def _written_at(path: Path) -> tuple[float, str]:
    """When an event file was opened: the seconds in its name (events.out.tfevents.<seconds>.<host>...), else its
    modification time; then its path."""
    m = re.match(r"events\.out\.tfevents\.(\d+(?:\.\d+)?)", path.name)
    return (float(m.group(1)) if m else path.stat().st_mtime, str(path))


def _trainer_state(d: Path) -> Path | None:
    """The folder's trainer_state.json, else its newest checkpoint's (the one with the longest history)."""
    if (d / "trainer_state.json").is_file():
        return d / "trainer_state.json"
    ckpts = [p / "trainer_state.json" for p in d.glob("checkpoint-*") if p.name[11:].isdigit()]
    return max((p for p in ckpts if p.is_file()), key=lambda p: int(p.parent.name[11:]), default=None)


def load_any(path: Path) -> tuple[Run, str]:
    """The run at `path` and what kind of source it was; a path that holds no run is refused."""
    path = Path(path)
    what = (
        "give a grpokit run folder, a TRL/transformers output_dir (trainer_state.json), a folder of "
        "TensorBoard event files, or a .jsonl/.csv export of the metrics"
    )
    if not path.exists():
        raise ConfigError(f"{str(path)!r} does not exist; {what}")
    name = path.resolve().name
    if path.is_file():
        if path.name == "trainer_state.json":
            return Run(path.parent, name, metrics=read_trainer_state(path)), "trainer_state.json"
        if path.name.startswith("events.out.tfevents"):
            return Run(path.parent, name, metrics=read_tensorboard([path])), "TensorBoard"
        if path.suffix == ".jsonl":
            return Run(path.parent, name, metrics=read_jsonl_export(path)), "JSONL export"
        if path.suffix == ".csv":
            return Run(path.parent, name, metrics=read_csv_export(path)), "CSV export"
        raise ConfigError(f"{str(path)!r} is a file, not a run folder nor a metrics export the doctor reads; {what}")
    if any((path / n).is_file() for n in ("config.yaml", "metrics.jsonl", "summary.json")):
        return load_run(path), "grpokit run"
    state = _trainer_state(path)
    if state is not None:
        return Run(path, name, metrics=read_trainer_state(state)), f"trainer_state.json ({state.relative_to(path)})"
    events = sorted(path.rglob("events.out.tfevents*"))
    if events:
        return Run(path, name, metrics=read_tensorboard(events)), "TensorBoard"
    raise ConfigError(
        f"{str(path)!r} holds no run (no config.yaml, metrics.jsonl or summary.json), no trainer_state.json and "
        f"no TensorBoard event file; {what}"
    )
