"""Run folders that are never lost: what a start or a resume checks and records before training.

A run folder holds ``config.yaml`` (the config the run started with, written atomically),
``config_history.yaml`` (what a resume changed, and at which step), ``checkpoints/`` and the
records. The rules, each for a way a run was lost before:

* a new run never starts in a folder that holds another run (its retention would delete the older
  run's checkpoints) unless ``train.overwrite`` says so (the older run is deleted) or
  ``train.move_earlier_run`` does (the older run moves whole to ``earlier-runs/<time>/``, said in one
  line); ``train.out`` naming a file is refused;
* folders of an interrupted save (``checkpoints/.tmp-step-*``) are removed at the next start;
* a resume reads ``config.yaml`` plus its history and refuses a torn or emptied file with one
  sentence instead of training on the defaults;
* a resume continues from the newest checkpoint that verifies against its manifest, saying which
  newer ones it skipped and why; a resume from a named checkpoint (``checkpoints/step-N``) continues
  from exactly that one or is refused, and the checkpoints after it move to ``earlier-runs/<time>/``
  with a copy of the records as they were (the run's own records then continue from step N);
* a resume that changes the config (overrides, ``--out``) appends the changed fields to
  ``config_history.yaml`` instead of rewriting ``config.yaml``.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from grpokit.config.io import from_dict, sealed, set_field, strict_yaml, to_dict, unsealed
from grpokit.config.sections import Config, ConfigError

from . import checkpoint, run_lock

CONFIG_FILE = "config.yaml"
HISTORY_FILE = "config_history.yaml"
RUN_FILES = (CONFIG_FILE, HISTORY_FILE, "summary.json", "metrics.jsonl", "samples.jsonl", "health.jsonl", "report.html")
EARLIER = "earlier-runs"  # inside a run folder: runs (or a run's later checkpoints) set aside, never deleted
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def is_storage_fault(e: BaseException) -> bool:
    """A write that failed because the disk is full, over quota or read-only: not the user's mistake
    and not a bug; the run stops with a sentence and resumes once there is room."""
    return isinstance(e, OSError) and e.errno in STORAGE_ERRNOS


def new_run_dir(name: str) -> str:
    """``name``, or ``name-2``, ``name-3`` ... when a run started in the same second holds it."""
    k, out = 1, name
    while Path(out).exists():
        k += 1
        out = f"{name}-{k}"
    return out


def prepare_run_dir(
    run_dir: Path,
    overwrite: bool,
    resuming: bool,
    start_if_no_checkpoint: bool = False,
    log=print,
    move_earlier: bool = False,
) -> tuple[run_lock.RunLock | run_lock.NullLock, bool]:
    """Take the folder's lock (one writer: run_lock.py); refuse a folder that is a file or (for a new run)
    holds another run, unless ``overwrite`` (it is deleted) or ``move_earlier`` (it moves to
    ``earlier-runs/<time>/``); clean interrupted saves. With ``start_if_no_checkpoint`` (``grpokit train
    --resume``), a folder without any checkpoint (none yet, or a run stopped before its first save)
    starts the run from step 0 there. Returns the lock and whether a checkpoint is to be resumed."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(
            f"train.out={str(run_dir)!r} is an existing file, not a folder; give a new or empty folder for the run"
        )
    from grpokit.train.distributed import position

    lock = run_lock.acquire(run_dir, log)  # before anything is deleted: a live writer is refused here
    ckpts = run_dir / "checkpoints"
    if resuming and start_if_no_checkpoint and not has_checkpoints(run_dir):
        restart = (run_dir / CONFIG_FILE).is_file()  # a grpokit run stopped before its first save: its records go
        resuming, overwrite = False, overwrite or restart
        if position()[0] == 0:
            log(
                f"grpokit: {run_dir} holds no checkpoint yet, so --resume starts "
                + ("the run again from step 0 (its records so far are replaced)" if restart else "a new run there"),
                flush=True,
            )
    if position()[0] != 0:  # torchrun: rank 0 alone checks and cleans the folder
        return lock, resuming
    for tmp in ckpts.glob(f".tmp-{checkpoint.PREFIX}*") if ckpts.is_dir() else ():
        shutil.rmtree(tmp, ignore_errors=True)  # an interrupted save: never a checkpoint, only disk used
    held = [n for n in RUN_FILES if (run_dir / n).exists()] + (
        ["checkpoints/"] if ckpts.is_dir() and any(ckpts.iterdir()) else []
    )
    if held and not resuming:
        if move_earlier and not overwrite:
            moved = set_aside(run_dir, sorted(ckpts.glob(f"{checkpoint.PREFIX}*")), move_files=True)
            log(
                f"grpokit: {run_dir} held an earlier run ({', '.join(held)}); it was moved whole to {moved} "
                "(nothing deleted) and the new run starts in an empty folder",
                flush=True,
            )
            return lock, resuming
        if not overwrite:
            lock.release()
            raise ConfigError(
                f"train.out={str(run_dir)!r} already holds a run ({', '.join(held)}); continue it with --resume "
                f"{run_dir}, choose another folder, or pass --overwrite (train.overwrite=true) to replace it"
            )
        shutil.rmtree(ckpts, ignore_errors=True)
        for n in RUN_FILES:
            (run_dir / n).unlink(missing_ok=True)
    return lock, resuming


def set_aside(run_dir: Path, checkpoints: list[Path], move_files: bool) -> Path:
    """Move ``checkpoints`` (folders of ``run_dir/checkpoints``) into a new ``run_dir/earlier-runs/<time>/``
    with the links of ``run_dir`` that point into them (TRL's ``checkpoint-N``, made relative there), and
    the run's records (RUN_FILES, tensorboard/): moved with ``move_files`` (a new run starts), else copied
    as they are (a resume from an earlier checkpoint, whose own records are then cut back to its step).
    Returns the new folder; nothing is deleted."""
    dest = Path(new_run_dir(str(run_dir / EARLIER / f"{datetime.now():%Y%m%d-%H%M%S}")))
    (dest / "checkpoints").mkdir(parents=True)
    moved = {c.resolve(): dest / "checkpoints" / c.name for c in checkpoints}
    for link in sorted(run_dir.iterdir()):
        if not link.is_symlink():
            continue
        target = (run_dir / os.readlink(link)).resolve() if not link.exists() else link.resolve()
        for old, new in moved.items():
            if target == old or old in target.parents:
                (dest / link.name).symlink_to(os.path.relpath(new / target.relative_to(old), dest))
                link.unlink()
    for old, new in moved.items():
        os.replace(old, new)
    for name in (*RUN_FILES, "tensorboard"):
        src = run_dir / name
        if not src.exists():
            continue
        if move_files:
            os.replace(src, dest / name)
        elif src.is_file():
            shutil.copy2(src, dest / name)
        else:
            shutil.copytree(src, dest / name)
    return dest


def checkpoint_folder(path: Path) -> tuple[Path, Path] | None:
    """``(run folder, checkpoint)`` when ``path`` is a grpokit checkpoint folder ``<run>/checkpoints/step-N``
    (a link to one resolved first), else None."""
    p = Path(path).resolve()
    if p.name.startswith(checkpoint.PREFIX) and p.parent.name == "checkpoints":
        return p.parent.parent, p
    return None


def has_checkpoints(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds any step checkpoint (complete or not; interrupted saves do not count)."""
    ckpts = Path(run_dir) / "checkpoints"
    return ckpts.is_dir() and any(p.is_dir() for p in ckpts.glob(f"{checkpoint.PREFIX}*"))


def load_run_config(run_dir: Path, doing: str = "resuming") -> Config:
    """The config a run in ``run_dir`` has now: its config.yaml with every change of its history applied.
    ``doing`` ("resuming", "evaluating it") ends the sentence that refuses a torn file."""
    f = Path(run_dir) / CONFIG_FILE
    if not f.is_file():
        raise ConfigError(
            f"--resume {str(run_dir)!r} is not a run folder (no config.yaml); give the folder a run was started with"
        )
    try:
        data = strict_yaml(_read_sealed(f, doing), f"the run's {str(f)!r}")
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"{str(f)!r} is torn or damaged ({type(e).__name__}); restore the run's config.yaml before {doing}"
        ) from None
    sections = [x.name for x in dataclasses.fields(Config)]
    missing = [s for s in sections if not isinstance(data, dict) or s not in data]
    if missing:
        what = "empty" if not data else f"missing the section(s) {', '.join(missing)}"
        raise ConfigError(
            f"{str(f)!r} is {what}, so it is torn or was emptied; restore the run's config.yaml "
            f"({doing} with defaults would silently use another config)"
        )
    cfg = from_dict(data)
    for entry in _history(run_dir, doing):
        for dotted, change in (entry.get("changed") or {}).items():
            _apply_change(cfg, run_dir / HISTORY_FILE, entry.get("step"), dotted, change, doing)
    return cfg


def _apply_change(cfg: Config, f: Path, step: Any, dotted: str, change: Any, doing: str = "resuming") -> None:
    """One change of config_history.yaml; a change without its new value (a torn entry that no
    checksum guards: an old file, or one whose checksum line was removed) is refused, not set to None."""
    if isinstance(change, dict) and "to" not in change:
        raise ConfigError(
            f"{str(f)!r} changes {dotted} at step {step} without its new value ('to:'), so the file is torn or "
            f"damaged; restore it from a copy, or give the entry its 'to:' value, before {doing}"
        )
    try:
        set_field(cfg, dotted, change["to"] if isinstance(change, dict) else change)
    except (ConfigError, ValueError, TypeError) as e:
        raise ConfigError(f"{str(f)!r}, the change of {dotted} at step {step}: {e}") from None


def write_config(run_dir: Path, cfg: Config, resume_step: int | None) -> None:
    """A new run writes config.yaml; a resume appends what changed to config_history.yaml."""
    if resume_step is None or not (run_dir / CONFIG_FILE).is_file():
        _atomic_write(run_dir / CONFIG_FILE, sealed(yaml.safe_dump(to_dict(cfg), sort_keys=False)))
        return
    changed = config_changes(load_run_config(run_dir), cfg)
    if changed:
        history = _history(run_dir) + [{"step": resume_step, "changed": changed}]
        _atomic_write(run_dir / HISTORY_FILE, sealed(yaml.safe_dump(history, sort_keys=False)))


def config_changes(before: Config, after: Config) -> dict[str, dict[str, Any]]:
    """``{"section.field": {"from": old, "to": new}}`` for every field that differs."""
    a, b = to_dict(before), to_dict(after)
    return {f"{s}.{k}": {"from": a[s].get(k), "to": v} for s in b for k, v in b[s].items() if a.get(s, {}).get(k) != v}


def newest_verified(ckpt_dir: Path, log=None, *, model_only_ok: bool = False) -> Path | None:
    """The newest checkpoint under ``ckpt_dir`` that verifies (``log`` hears of each one skipped, and
    which one is used then). A checkpoint without a manifest is taken for one written before manifests
    existed only when no older checkpoint has one (checkpoint.verify); ``model_only_ok``: the run asked
    for model-only saves, so a checkpoint may lack its optimizer and random states."""
    found = sorted(p for p in ckpt_dir.glob(f"{checkpoint.PREFIX}*") if p.is_dir())
    # a save writes its manifest since issue 26: a checkpoint after one that has it must have it too
    first_listed = next((i for i, p in enumerate(found) if checkpoint.has_manifest(p)), len(found))
    skipped = 0
    for i in range(len(found) - 1, -1, -1):
        p = found[i]
        fault = checkpoint.verify(p, model_only_ok=model_only_ok, legacy_ok=i < first_listed)
        if fault is None:
            if log is not None and skipped:
                log(f"grpokit: resuming from {p}, the newest checkpoint that verifies whole", flush=True)
            if log is not None and not checkpoint.has_manifest(p):
                log(
                    f"grpokit: warning: checkpoint {p} has no manifest.json (written by a grpokit from before "
                    "checkpoint manifests); its files are complete but cannot be verified, so it is used as it is",
                    flush=True,
                )
            return p
        skipped += 1
        if log is not None:
            log(f"grpokit: warning: skipping checkpoint {p} because {fault}; trying the one before it", flush=True)
    return None


def checkpoint_to_resume(run_dir: Path, log=print, *, model_only_ok: bool = False, at: Path | None = None) -> Path:
    """The newest checkpoint of ``run_dir`` that verifies; each newer one skipped is named with its fault.
    ``at`` (a checkpoint named by the user): that one, refused in one sentence if it does not verify, never
    another in its place."""
    if at is not None:
        found = sorted(p for p in (run_dir / "checkpoints").glob(f"{checkpoint.PREFIX}*") if p.is_dir())
        if not Path(at).is_dir():
            raise ConfigError(
                f"the checkpoint to resume from, {str(at)!r}, does not exist; name one of "
                f"{[p.name for p in found] or 'the run checkpoints (it has none)'} or the run folder for its newest"
            )
        index = [p.name for p in found].index(Path(at).name) if Path(at).name in {p.name for p in found} else 0
        first_listed = next((i for i, p in enumerate(found) if checkpoint.has_manifest(p)), len(found))
        fault = checkpoint.verify(at, model_only_ok=model_only_ok, legacy_ok=index < first_listed)
        if fault is not None:
            raise ConfigError(
                f"the checkpoint to resume from, {str(at)!r}, is damaged ({fault}); name another checkpoint, "
                "or the run folder to resume from its newest one that verifies"
            )
        return Path(at)
    found = newest_verified(run_dir / "checkpoints", log, model_only_ok=model_only_ok)
    if found is not None:
        return found
    raise ConfigError(
        f"--resume {str(run_dir)!r} has no complete checkpoint under checkpoints/ that verifies; nothing to resume"
    )


def set_aside_later(run_dir: Path, resumed: Path, log=print) -> Path | None:
    """A resume from ``resumed``, an earlier checkpoint than the run's newest: the later checkpoints (another
    continuation of the run) move to ``earlier-runs/<time>/`` with a copy of the run's records as they are
    (set_aside), so the run folder holds one history and nothing is lost. Returns that folder (None: no later one)."""
    later = [
        p
        for p in sorted((run_dir / "checkpoints").glob(f"{checkpoint.PREFIX}*"))
        if p.is_dir() and _step(p) > _step(resumed)
    ]
    if not later:
        return None
    dest = set_aside(run_dir, later, move_files=False)
    log(
        f"grpokit: resuming from {resumed.name}, earlier than the run's newest checkpoint; the later ones "
        f"({', '.join(p.name for p in later)}) and a copy of the run's records as they were are moved to {dest}, "
        f"and the run's records continue from {resumed.name}",
        flush=True,
    )
    return dest


def _step(folder: Path) -> int:
    """The step of a checkpoint folder ``step-000123`` (-1 for a name that holds none)."""
    digits = folder.name[len(checkpoint.PREFIX) :]
    return int(digits) if digits.isdigit() else -1


def _history(run_dir: Path, doing: str = "resuming") -> list[dict]:
    f = Path(run_dir) / HISTORY_FILE
    if not f.is_file():
        return []
    try:
        data = strict_yaml(_read_sealed(f, doing), f"the run's {str(f)!r}") or []
    except (yaml.YAMLError, UnicodeDecodeError):
        data = None
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise ConfigError(
            f"{str(f)!r} is torn or damaged (not a list of changes); restore it, or remove it to use config.yaml "
            f"alone, before {doing}"
        )
    return data


_UNSEALED_SAID: set[str] = set()


def _read_sealed(f: Path, doing: str = "resuming") -> str:
    """The text of a run's config.yaml or config_history.yaml after its checksum line, verified
    (config.io.unsealed). One written before checksums is read as it is, and said so once."""
    text, checked = unsealed(f.read_text(encoding="utf-8"), repr(str(f)), doing)
    if not checked and str(f) not in _UNSEALED_SAID and os.environ.get("RANK", "0") == "0":
        _UNSEALED_SAID.add(str(f))
        print(
            f"grpokit: warning: {f} has no checksum line (written by a grpokit from before run-file checksums), "
            "so damage to it cannot be detected; it is read as it is",
            flush=True,
        )
    return text


def read_summary(run_dir: Path, resuming: bool) -> dict[str, Any]:
    """A resumed run's summary.json so far ({} for a new run or none yet)."""
    p = run_dir / "summary.json"
    if not (resuming and p.exists()):
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{str(p)!r} is torn or damaged (not a JSON object); restore it, or remove it to resume with the "
            "summary started afresh"
        )
    return data


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json, replaced whole (a reader never sees half of it)."""
    _atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2))


def _atomic_write(path: Path, text: str) -> None:
    """``path`` replaced whole by ``text``: written and fsynced under a temporary name, then renamed
    (and the folder fsynced), so a kill or a power cut leaves the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # a filesystem that cannot fsync a folder: the rename itself is still atomic
        pass
