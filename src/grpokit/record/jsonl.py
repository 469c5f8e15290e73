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
  died mid-write) is dropped too instead of breaking every later reader. Steps before the
  checkpoint that have no row (the file was removed or cut while the run wrote it) are named in one
  line: nothing is rebuilt from a file that lost rows without saying so.
- A file removed or renamed while the run writes it (a cleanup job, log rotation) is noticed after
  each line (the open file's device and inode against the path's: one stat): a new file is opened
  at the path, the line is written again there, and one line says where the earlier rows went (the
  renamed file, or nowhere: removed). A line the disk refuses (ENOSPC) is cut back off, so no
  partial line stays behind, and the OSError names the file.
"""

from __future__ import annotations

import errno
import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

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
    _rewrite(path, kept)
    return dropped


def _rewrite(path: Path, lines: list[str]) -> None:
    """`path` replaced by ``lines`` through a temporary file and `os.replace`."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())  # the records replaced by a copy that is on disk, not only in the page cache
        os.replace(tmp, path)
    except BaseException:  # ENOSPC mid-write: the original file stays whole, the partial copy goes
        tmp.unlink(missing_ok=True)
        raise


def amend_jsonl(path: Path, step: int, extra: Mapping[str, Any]) -> None:
    """Add ``extra`` to the last row of `path` whose "step" is ``step`` (a row of its own at the end when none
        has it), the file rewritten whole as `truncate_jsonl` rewrites it: a crash here never loses it. Used when a
    resumed run makes up an evaluation a stop cut: its row then holds what an uninterrupted run's holds."""
    path = Path(path)
    rows = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []
    rows = [r for r in rows if r]
    at = next((i for i in range(len(rows) - 1, -1, -1) if _step_of(rows[i]) == step), None)
    line = dumps_line({**(json.loads(rows[at]) if at is not None else {"step": step}), **extra})
    rows = rows[:at] + [line] + rows[at + 1 :] if at is not None else [*rows, line]
    _rewrite(path, [r + "\n" for r in rows])


def _step_of(line: str) -> Any:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    return obj.get("step") if isinstance(obj, dict) else None


def steps_missing(path: Path, max_step: int) -> list[int]:
    """The steps 1..``max_step`` that have no row in the JSON-lines file at ``path``."""
    have = {r.get("step") for r in iter_jsonl(path)}
    return [s for s in range(1, max_step + 1) if s not in have]


def spans(steps: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    out: list[list[int]] = []
    for s in steps:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


class AppendFile:
    """One append-only file of a run, written through a file descriptor (no Python buffer that could
    write half a line later), that notices when its path stops naming the file it writes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        self._ident = (0, 0)

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        st = os.fstat(self._fd)
        self._ident = (st.st_dev, st.st_ino)

    def append(self, data: bytes) -> int:
        """Write ``data`` whole and return where it starts, or raise the OSError (naming the file) with
        nothing of it left behind."""
        if self._fd < 0:
            self.open()
        start = os.fstat(self._fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as e:
            try:
                os.ftruncate(self._fd, start)  # a partial line never stays behind (a full disk, a quota)
            except OSError:
                pass
            raise OSError(e.errno, e.strerror or os.strerror(e.errno or errno.EIO), str(self.path)) from None
        return start

    def take_back(self, start: int) -> None:
        """Cut the open file back to ``start`` (a line written to a file that was renamed meanwhile)."""
        try:
            os.ftruncate(self._fd, start)
        except OSError:
            pass

    def gone(self) -> str | None:
        """None while the path names the open file; else "renamed" (the file lives on under another name)
        or "removed"."""
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._ident:
                return None
        except FileNotFoundError:
            pass
        return "renamed" if os.fstat(self._fd).st_nlink > 0 else "removed"

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class JsonlSink:
    """Writes metrics.jsonl, samples.jsonl and health.jsonl into `run_dir`, one whole line each.

    `resume_step=None` starts fresh files (a new run owns its directory); an integer keeps the
    existing files, drops their lines with step > resume_step and appends after them.
    """

    name = "jsonl"

    def __init__(self, run_dir: Path, resume_step: int | None = None, say=print) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._say = say
        for fname in (METRICS_FILE, SAMPLES_FILE, HEALTH_FILE):
            if resume_step is None:
                (self.run_dir / fname).unlink(missing_ok=True)  # a fresh run owns its files
            else:
                truncate_jsonl(self.run_dir / fname, resume_step)
        if resume_step:
            lost = steps_missing(self.run_dir / METRICS_FILE, resume_step)
            if lost:
                self._say(
                    f"grpokit: warning: {self.run_dir / METRICS_FILE} has no rows for step(s) {spans(lost)} of the "
                    f"{resume_step} before the checkpoint (the file was removed, renamed or cut while the run "
                    "wrote it); the health checks and the report go on from the rows it has",
                    flush=True,
                )
        self._files: dict[str, AppendFile] = {}
        self._last_step: dict[str, int] = {}

    def _write(self, fname: str, record: Mapping[str, Any]) -> None:
        f = self._files.get(fname)
        if f is None:  # opened lazily: a run without samples leaves no empty samples.jsonl behind
            f = self._files[fname] = AppendFile(self.run_dir / fname)
        data = (dumps_line(record) + "\n").encode("utf-8")
        start = f.append(data)
        how = f.gone()
        if how is not None:  # the line just written went to a file no longer at the path: a new one takes it
            f.take_back(start)  # (a renamed file keeps only the rows written before it was renamed)
            f.close()
            f.open()
            f.append(data)
            self._moved(fname, how, record.get("step"))
        self._last_step[fname] = record.get("step", -1)

    def _moved(self, fname: str, how: str, step: Any) -> None:
        before = self._last_step.get(fname)
        rows = f"its rows up to step {before} are " if before is not None else "its earlier rows are "
        where = rows + ("in the renamed file" if how == "renamed" else "lost with it")
        message = (
            f"{self.run_dir / fname} was {how} while the run wrote it; a new {fname} continues from step {step} "
            f"({where})"
        )
        self._say(f"grpokit: warning: {message}", flush=True)
        if fname != HEALTH_FILE:
            self._write(HEALTH_FILE, {"step": step, "monitor": "record", "message": message, "level": "warning"})

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._write(METRICS_FILE, {"step": step, **metrics})

    def amend(self, metrics: Mapping[str, float], step: int) -> None:
        """``metrics`` added to the row of ``step``, already written (an evaluation a stop cut, run at --resume)."""
        f = self._files.pop(METRICS_FILE, None)
        if f is not None:  # the file is replaced: the next line opens the new one
            f.close()
        amend_jsonl(self.run_dir / METRICS_FILE, step, metrics)

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
