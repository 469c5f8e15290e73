"""The JSON-lines files of a run directory: the run's own record, always written.

Three append-only files live in RUN_DIR:

    metrics.jsonl   one object per `Recorder.log` call: {"step": 3, "reward": 0.41, ...}
    samples.jsonl   one object per logged prompt: {"step", "prompt", "completions": [...]}
    health.jsonl    one object per health event: {"step", "monitor", "message", "value", "level"}
                    (level "warning", or "info" for a converged run)

Design choices, each for a failure we want to survive:

- Every line is flushed as soon as it is written, so a run killed by the OOM killer or Ctrl-C keeps
  every step it finished.
- JSON has no NaN or infinity. Python's json module would happily write the bare token `NaN`, which
  most other readers reject, so non-finite floats are written as the strings "NaN", "Infinity" and
  "-Infinity"; `read_jsonl` turns them back into floats. The file stays valid JSON lines.
- A resumed run calls `truncate_jsonl` to drop lines with a step beyond the checkpoint it resumes
  from, so its files end up equal to those of an uninterrupted run. A torn last line (the process
  died mid-write) is dropped too instead of breaking every later reader.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
HEALTH_FILE = "health.jsonl"

_NONFINITE_TO_STR = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
_STR_TO_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


MAX_JSON_DEPTH = 64  # deeper containers (a tool's arguments or result, model-written) are cut, not a RecursionError


def to_json_value(value: Any, _depth: int = 0) -> Any:
    """Convert one value into something `json.dumps` writes as strict JSON.

    Tensors and numpy scalars become Python numbers (via `.item()`), non-finite floats become the
    strings "NaN" / "Infinity" / "-Infinity", containers are converted recursively (below
    MAX_JSON_DEPTH levels; a deeper one becomes a short note), and anything else unknown becomes its `str()`.
    Examples: `float("nan") -> "NaN"`, `torch.tensor(2.5) -> 2.5`.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if hasattr(value, "item") and callable(value.item):  # torch / numpy scalar
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # a tensor with more than one element
            return to_json_value(value.tolist(), _depth)
        return to_json_value(value, _depth)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return _NONFINITE_TO_STR[repr(value)]
    if isinstance(value, (Mapping, list, tuple)) and _depth >= MAX_JSON_DEPTH:
        return f"[nested deeper than {MAX_JSON_DEPTH} levels]"
    if isinstance(value, Mapping):
        return {str(k): to_json_value(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v, _depth + 1) for v in value]
    try:
        return str(value)
    except Exception as exc:  # an object whose __str__ raises (a tool's result) must not stop the record
        return f"[str() failed: {type(exc).__name__}]"


def from_json_value(value: Any) -> Any:
    """Inverse of `to_json_value` for floats: "NaN" -> nan, "Infinity" -> inf, recursively."""
    if isinstance(value, str):
        return _STR_TO_NONFINITE.get(value, value)
    if isinstance(value, dict):
        return {k: from_json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_value(v) for v in value]
    return value


def dumps_line(record: Mapping[str, Any]) -> str:
    """One strict-JSON line (no trailing newline); raises if something slipped through as NaN."""
    return json.dumps(to_json_value(record), allow_nan=False, ensure_ascii=False)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file written by this module; missing file -> []. Torn lines are skipped."""
    return list(iter_jsonl(path))


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the objects of a JSON-lines file one by one, skipping blank or unparsable lines."""
    path = Path(path)
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line from a killed process
            if isinstance(obj, dict):
                yield from_json_value(obj)


def truncate_jsonl(path: Path, max_step: int) -> int:
    """Keep only the lines of `path` whose "step" is <= `max_step`; return how many were dropped.

    Used on resume: a run that wrote steps 1..57 and is resumed from the checkpoint of step 50 must
    forget steps 51..57, which will be recomputed. Lines without a "step" key are kept. The file
    is rewritten through a temporary file and `os.replace`, so a crash here never loses it.
    """
    path = Path(path)
    if not path.exists():
        return 0
    kept: list[str] = []
    dropped = 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            stripped = line.strip()
            if not stripped:
                continue
            try:
                obj = json.loads(stripped)
            except json.JSONDecodeError:
                dropped += 1
                continue
            step = obj.get("step") if isinstance(obj, dict) else None
            if isinstance(step, (int, float)) and step > max_step:
                dropped += 1
                continue
            kept.append(stripped + "\n")
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(kept)
        os.replace(tmp, path)
    except BaseException:  # ENOSPC mid-write: the original file stays whole, the partial copy goes
        tmp.unlink(missing_ok=True)
        raise
    return dropped


class JsonlSink:
    """Writes metrics.jsonl, samples.jsonl and health.jsonl into `run_dir`, one flushed line each.

    `resume_step=None` starts fresh files (a new run owns its directory); an integer keeps the
    existing files, drops their lines with step > resume_step and appends after them.
    """

    name = "jsonl"

    def __init__(self, run_dir: Path, resume_step: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for fname in (METRICS_FILE, SAMPLES_FILE, HEALTH_FILE):
            if resume_step is None:
                (self.run_dir / fname).unlink(missing_ok=True)  # a fresh run owns its files
            else:
                truncate_jsonl(self.run_dir / fname, resume_step)
        self._files: dict[str, TextIO] = {}

    def _write(self, fname: str, record: Mapping[str, Any]) -> None:
        f = self._files.get(fname)
        if f is None:  # opened lazily: a run without samples leaves no empty samples.jsonl behind
            f = self._files[fname] = (self.run_dir / fname).open("a", encoding="utf-8")
        f.write(dumps_line(record) + "\n")
        f.flush()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._write(METRICS_FILE, {"step": step, **metrics})

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._write(SAMPLES_FILE, {"step": step, **{k: v for k, v in row.items() if k != "step"}})

    def warn(self, step: int, event: Any) -> None:
        record = event.to_dict() if hasattr(event, "to_dict") else {"monitor": "note", "message": str(event)}
        self._write(HEALTH_FILE, {"step": step, **{k: v for k, v in record.items() if k != "step"}})

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
