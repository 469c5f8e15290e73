"""What the report shows, as plain data: runs read from their folders, panels, config differences.

`load_run(run_dir)` reads what a run left (metrics.jsonl, samples.jsonl, health.jsonl, config.yaml,
summary.json); `panels(runs)` decides which plots exist; `payload(runs, ...)` is the JSON the page's
script draws from. Keeping this in Python (not in the page) lets tests check the choices directly:

- every metric any run logged gets a panel, known ones grouped (reward with each reward function's
  mean, completion lengths, clip fractions, time per phase); metrics a reward function logs with
  `log_metric` and anything else namespaced get panels of their own namespace, after the panels per
  domain of a run with data.domains (domain_panels.py);
- a panel exists only when some run has a finite value for it (at beta 0 there is no KL panel);
- a series equal to an earlier one in the same panel (the total reward and its only component) is
  marked `same_as`, so the page draws it dashed on top instead of hiding it;
- sample images (PNG/JPEG files a samples row or completion names, e.g. under RUN_DIR/images/) are
  inlined as data: URIs so the file stays self-contained.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from .domain_panels import domain_panels
from .jsonl import HEALTH_FILE, METRICS_FILE, SAMPLES_FILE, read_jsonl
from .run_status import RunStatus, run_status
from .run_writer import Heartbeat

# (id, title, metric patterns): known metrics grouped on one panel; * matches within a name (fnmatch).
GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward", "Reward (total and per function, unweighted)", ("reward", "rewards/*/mean")),
    ("eval", "Held-out evaluation", ("eval/accuracy", "eval/*_rate", "eval/pass@*", "eval/mean@*", "eval/maj@*")),
    ("kl", "KL to reference", ("kl",)),
    ("entropy", "Entropy (nats per token)", ("entropy",)),
    (
        "length",
        "Completion length (tokens)",
        ("completions/mean_length", "completions/min_length", "completions/max_length"),
    ),
    ("clip", "Clipped tokens (fraction)", ("clip_ratio/*",)),
    (
        "signal",
        "Groups without signal (fractions)",
        ("frac_reward_zero_std", "completions/frac_groups_*"),
    ),
    ("truncated", "Truncated completions (fraction of completions)", ("completions/clipped_ratio",)),
    ("reward-std", "Reward spread", ("reward_std", "rewards/*/std")),
    (
        "faults",
        "Faults in untrusted code (docs/FAULTS.md)",
        (
            "rewards/failed_fraction",
            "rewards/*/failures",
            "rewards/*/machine_failures",
            "rewards/*/nonfinite",
            "rewards/*/zeroed",
            "rewards/*/timeouts",
            "rewards/*/tampering",
            "rewards/*/crashes",
            "rewards/*/limits",
            "rewards/*/not_applicable",
            "rewards/unscored",
            "episodes/tool_errors_mean",
            "episodes/tool_timeouts_mean",
            "episodes/reset_failures",
        ),
    ),
    (
        "episodes",
        "Episodes (tools)",
        (
            "episodes/turns_mean",
            "episodes/tool_use_rate",
            "tools/failure_frequency",
            "episodes/truncated_by_turns",
            "eval/tool_use_rate",
        ),
    ),
    ("time", "Time per phase (seconds per step)", ("time/*",)),
    ("throughput", "Throughput (tokens per second)", ("tokens_per_second",)),
    ("loss", "Loss", ("loss",)),
    ("grad-norm", "Gradient norm (before clipping)", ("grad_norm", "grad_norm/max")),  # a step's mean, largest
    ("lr", "Learning rate", ("learning_rate",)),
)
MAX_SAMPLE_CHARS = 4000  # per text; a report is read, not archived: samples.jsonl keeps everything
MAX_IMAGE_BYTES = 2_000_000
IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}


@dataclass
class Run:
    """One run folder as read from disk (any file may be missing)."""

    path: Path
    name: str
    metrics: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    config_text: str = ""
    config: dict[str, Any] = field(default_factory=dict)  # config.yaml with config_history.yaml applied (the run now)
    changes: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)  # field -> [(first step, new value)]
    config_note: str = ""  # what of config_history.yaml could not be read (the report says so)
    summary: dict[str, Any] = field(default_factory=dict)
    heartbeat: Heartbeat | None = field(default=None, repr=False, compare=False)
    """run.lock as one reader watches it across reads (``report --watch``); None: read once."""

    @cached_property
    def status(self) -> RunStatus:
        """How the run's training stands (run_status.py), judged once per read of the folder: the doctor's
        checks, the report's headline and its live reload all read this one verdict."""
        return run_status(self.path, self.summary, self.heartbeat)

    @property
    def finished(self) -> bool:
        """The trainer writes summary.json's "steps" when training ends (or is stopped); before that the
        file may hold only the evaluation before training, and the run is in progress, or ended without
        that record (failed, killed): run_status.py tells which."""
        return "steps" in self.summary


def read_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _read_config(path: Path) -> tuple[str, dict[str, Any]]:
    if not path.is_file():
        return "", {}
    return _read_config_text(path.read_text(encoding="utf-8", errors="replace"))


HISTORY_FILE = "config_history.yaml"  # train/resume.py writes it (record/ sits below train/: named here too)


def read_history(path: Path) -> tuple[list[tuple[int, str, Any]], str]:
    """The changes config_history.yaml records, as (first step they took effect, dotted field, new value): an
    entry's ``step`` is the checkpoint a --resume started from, so its values hold from the next step. A torn
    file (checksum, YAML, shape) or entry is left out and said in the returned note, not raised: a report shows
    what it can."""
    if not path.is_file():
        return [], ""
    from grpokit.config.io import unsealed
    from grpokit.config.sections import ConfigError

    try:
        body, _ = unsealed(path.read_text(encoding="utf-8", errors="replace"), repr(str(path)), "reading it")
        import yaml

        data = yaml.safe_load(body) or []
    except (ConfigError, Exception):  # a torn or hand-edited file
        data = None
    if not isinstance(data, list):
        return [], f"{path.name} is torn or damaged: the config shown is config.yaml as the run started"
    out, bad = [], 0
    for entry in data:
        step = entry.get("step") if isinstance(entry, dict) else None
        changed = entry.get("changed") if isinstance(entry, dict) else None
        if not isinstance(step, int) or not isinstance(changed, dict):
            bad += 1
            continue
        for dotted, change in changed.items():
            if isinstance(change, dict) and "to" not in change:
                bad += 1
                continue
            out.append((step + 1, str(dotted), change["to"] if isinstance(change, dict) else change))
    note = f"{path.name} has {bad} torn entr{'y' if bad == 1 else 'ies'}, left out" if bad else ""
    return out, note


def _apply(cfg: dict[str, Any], dotted: str, value: Any) -> None:
    node = cfg
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
    node[last] = value


def load_run(run_dir: Path, name: str | None = None, heartbeat: Heartbeat | None = None) -> Run:
    run_dir = Path(run_dir)
    text, cfg = _read_config(run_dir / "config.yaml")
    history, note = read_history(run_dir / HISTORY_FILE)
    changes: dict[str, list[tuple[int, Any]]] = {}
    for step, dotted, value in history:  # as --resume reads the run (train/resume.py:load_run_config)
        if cfg:
            _apply(cfg, dotted, value)
        changes.setdefault(dotted, []).append((step, value))
    return Run(
        path=run_dir,
        name=name or run_dir.resolve().name,
        metrics=read_jsonl(run_dir / METRICS_FILE),
        samples=read_jsonl(run_dir / SAMPLES_FILE),
        events=read_jsonl(run_dir / HEALTH_FILE),
        config_text=text,
        config=cfg,
        changes=changes,
        config_note=note,
        summary=read_json(run_dir / "summary.json"),
        heartbeat=heartbeat,
    )


def unique_names(paths: Sequence[Path]) -> list[str]:
    """Short labels for runs: the folder name, with its parent when two folders share a name."""
    names = [Path(p).resolve().name for p in paths]
    return [f"{Path(p).resolve().parent.name}/{n}" if names.count(n) > 1 else n for p, n in zip(paths, names)]


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def metric_names(runs: Sequence[Run]) -> tuple[list[str], list[str]]:
    """(names with a finite non-zero value in some run, names that are 0 wherever finite), in
    first-seen order: a panel of flat zeros (no clipped tokens, no failures) says less than a line."""
    names: dict[str, bool] = {}
    for run in runs:
        for row in run.metrics:
            for k, v in row.items():
                if k != "step" and _finite(v):
                    names[k] = names.get(k, False) or v != 0
    return [k for k, nz in names.items() if nz], [k for k, nz in names.items() if not nz]


def panels(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The plots to draw: [{"id", "title", "keys"}], known groups first, then one panel per namespace
    (the part of a name before its last "/") of everything else, e.g. a reward's `log_metric` names."""
    names = metric_names(runs)[0]
    taken: set[str] = set()
    out = []
    for pid, title, patterns in GROUPS:
        keys = [n for p in patterns for n in fnmatch.filter(names, p) if n not in taken]
        keys = list(dict.fromkeys(keys))
        if keys or (pid == "eval" and any(heldout(r) for r in runs)):  # summary.json alone also makes the panel
            taken.update(keys)
            out.append({"id": pid, "title": title, "keys": keys})
    for p in domain_panels([n for n in names if n not in taken]):  # before the per-namespace fallback
        taken.update(p["keys"])
        out.append(p)
    rest: dict[str, list[str]] = {}
    for n in names:
        if n not in taken:
            rest.setdefault(n.rsplit("/", 1)[0] if "/" in n else n, []).append(n)
    out += [{"id": f"m-{i}", "title": ns, "keys": keys} for i, (ns, keys) in enumerate(rest.items())]
    return out


def heldout(run: Run) -> list[list[float]]:
    """summary.json's held-out accuracy before (step 0) and after training (its last step), as
    [[step, accuracy], ...]: drawn as points on the evaluation panel."""
    last = max((r["step"] for r in run.metrics if _finite(r.get("step"))), default=0)
    steps = run.summary.get("steps") if _finite(run.summary.get("steps")) else last
    return [
        [x, float(run.summary[k]["accuracy"])]
        for k, x in (("eval_before", 0), ("eval_after", steps))
        if isinstance(run.summary.get(k), dict) and _finite(run.summary[k].get("accuracy"))
    ]


def columns(run: Run, keys: Sequence[str]) -> tuple[list[float], dict[str, list[float | None]]]:
    """The run's steps and, per key, its values at those steps (None: missing or not finite)."""
    rows = [r for r in run.metrics if _finite(r.get("step"))]
    steps = [r["step"] for r in rows]
    return steps, {k: [_round(r.get(k)) for r in rows] for k in keys}


def _round(v: Any) -> float | None:
    """6 significant digits: the page shows 4, and the file stays small for long runs."""
    return float(f"{v:.6g}") if _finite(v) else None


def same_as(runs: Sequence[Run], keys: Sequence[str]) -> dict[str, str]:
    """{key: earlier key} for series whose values equal an earlier key's in every run (e.g. the total
    reward and its only reward function): drawn dashed on top, so neither hides the other."""
    cols = [columns(r, keys)[1] for r in runs]
    out: dict[str, str] = {}
    for i, k in enumerate(keys):
        for j in keys[:i]:
            if j not in out and all(c[k] == c[j] and any(v is not None for v in c[k]) for c in cols):
                out[k] = j
                break
    return out


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(cfg, dict):
        out: dict[str, Any] = {}
        for k, v in cfg.items():
            out |= flatten(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]: cfg}


def config_diff(runs: Sequence[Run]) -> list[tuple[str, list[str]]]:
    """[(dotted field, [value in each run])] for the fields whose values differ between runs (train.out
    excluded: every run has its own folder). A value a --resume changed (config_history.yaml) shows the
    start's value and each change with the step it took effect: ``1.0, then 0.5 from step 3``."""
    flat = [flatten(r.config) for r in runs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    diff = []
    for k in keys:
        vals = [_shown(r, f, k) for r, f in zip(runs, flat)]
        if k != "train.out" and any(v != vals[0] for v in vals):
            diff.append((k, vals))
    return diff


def _shown(run: Run, flat: dict[str, Any], key: str) -> str:
    """One run's value of ``key`` in the comparison: the value now, or with its history where it changed."""
    if key not in flat:
        return "(absent)"
    changes = run.changes.get(key)
    if not changes:
        return json.dumps(flat[key], default=str)
    shown = [f"{json.dumps(v, default=str)} from step {s}" for s, v in changes]
    start = _start_value(run, key)
    return ", then ".join(([json.dumps(start, default=str)] if start is not _NONE else []) + shown)


_NONE = object()


def _start_value(run: Run, key: str) -> Any:
    """``key``'s value in config.yaml as the run started (before config_history.yaml), or _NONE."""
    _, start = _read_config_text(run.config_text)
    return flatten(start).get(key, _NONE)


def _read_config_text(text: str) -> tuple[str, dict[str, Any]]:
    """The text and its mapping ({} for a torn or hand-edited file: show the text, compare nothing)."""
    try:
        import yaml

        data = yaml.safe_load(text) if text else None
    except Exception:
        data = None
    return text, data if isinstance(data, dict) else {}


def _clip(text: Any) -> Any:
    if isinstance(text, str) and len(text) > MAX_SAMPLE_CHARS:
        return text[:MAX_SAMPLE_CHARS] + f"\n… [{len(text) - MAX_SAMPLE_CHARS} more characters]"
    return text


def _image(run_dir: Path, name: Any) -> str | None:
    """A data: URI for an image file inside the run folder (RUN_DIR/name or RUN_DIR/images/name)."""
    if not isinstance(name, str) or Path(name).suffix.lower() not in IMAGE_TYPES:
        return None
    root = run_dir.resolve()
    for cand in (root / name, root / "images" / name):
        try:
            path = cand.resolve()
            if path.is_relative_to(root) and path.is_file() and path.stat().st_size <= MAX_IMAGE_BYTES:
                data = base64.b64encode(path.read_bytes()).decode("ascii")
                return f"data:{IMAGE_TYPES[path.suffix.lower()]};base64,{data}"
        except OSError:
            continue
    return None


def _images(run_dir: Path, obj: dict[str, Any]) -> list[str]:
    names = [obj.get("image")] + (obj["images"] if isinstance(obj.get("images"), list) else [])
    return [uri for uri in (_image(run_dir, n) for n in names) if uri]


def samples_payload(run: Run) -> list[dict[str, Any]]:
    """samples.jsonl rows trimmed for the page: long texts clipped, images inlined, extras kept."""
    out = []
    for row in run.samples:
        comps = []
        for c in row.get("completions") or []:
            if not isinstance(c, dict):
                continue
            c = {k: _clip(v) for k, v in c.items() if k not in ("image", "images")} | {"images": _images(run.path, c)}
            if isinstance(c.get("messages"), list):
                c["messages"] = [{k: _clip(v) for k, v in m.items()} for m in c["messages"] if isinstance(m, dict)]
            comps.append(c)
        out.append(
            {
                "step": row.get("step"),
                "prompt": _clip(row.get("prompt", "")),
                "images": _images(run.path, row),
                "completions": comps,
            }
        )
    return out
