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
* a resume continues from the newest checkpoint that verifies against its manifest (run_checkpoints.py: the
  rule every reader of a run's weights follows), saying which
  newer ones it skipped and why; a resume from a named checkpoint (``checkpoints/step-N``) continues
  from exactly that one or is refused, and the checkpoints after it move to ``earlier-runs/<time>/``
  with a copy of the records as they were (the run's own records then continue from step N);
* a resume that changes the config (overrides, ``--out``) appends the changed fields to
  ``config_history.yaml`` instead of rewriting ``config.yaml``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from grpokit.config.io import from_dict, sealed, set_field, strict_yaml, to_dict, unsealed
from grpokit.config.sections import Config, ConfigError

from . import checkpoint, run_lock
from .run_checkpoints import has_checkpoints, step_of

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
    cfg = from_dict(data, source=f"the run's {str(f)!r}")
    for entry in _history(run_dir, doing):
        for dotted, change in (entry.get("changed") or {}).items():
            _apply_change(cfg, run_dir / HISTORY_FILE, entry.get("step"), dotted, change, doing)
    return cfg


# what makes the checkpoint's policy the one trained, and what a change would do instead (each refused at resume)
SAME_MODEL = {
    "name_or_path": "the policy comes from its checkpoint, but its KL reference, tokenizer and (LoRA) base model "
    "would come from the new model",
    "lora_rank": "its checkpoint holds the weights of the first (adapters of that rank, or the full model with 0)",
    "lora_alpha": "its checkpoint's adapters, scaled by lora_alpha / lora_rank, would compute another policy than "
    "the one trained",
}


def check_same_model(run_dir: Path, cfg: Config) -> None:
    """Refuse in one sentence a resume whose model section changes what the checkpoint's policy is (SAME_MODEL):
    a resume loads only the policy's weights (or adapters) from the checkpoint; the reference, the tokenizer and
    a LoRA base come from model.name_or_path. Other model fields (dtype, kernels, dropout ...) may change and are
    recorded in config_history.yaml. A path written another way that leads to the same folder is the same."""
    if not (Path(run_dir) / CONFIG_FILE).is_file():
        return
    run = load_run_config(run_dir)
    for name, why in SAME_MODEL.items():
        was, now = getattr(run.model, name), getattr(cfg.model, name)
        if was == now or (name == "name_or_path" and _same_folder(was, now)):
            continue
        moved = " (a model moved since: make its old path lead to it)" if name == "name_or_path" else ""
        raise ConfigError(
            f"model.{name} was {was!r} when the run in {str(run_dir)!r} was trained and is {now!r} now, so the "
            f"resumed run would train something else: {why}; resume with model.{name}={was!r}{moved}, or start "
            "a new run from the checkpoint's weights (model.name_or_path=<checkpoint>/model)"
        )


def check_same_batches(run_dir: Path, cfg: Config) -> None:
    """Refuse a resume that changes train.prompts_per_step or data.drop_last while whole batches are served: an
    epoch is then the whole batches of the order, so the checkpoint's data position means another place (and
    another epoch) under another batch."""
    if not (Path(run_dir) / CONFIG_FILE).is_file():
        return
    run = load_run_config(run_dir)
    was, now = (run.train.prompts_per_step, run.data.drop_last), (cfg.train.prompts_per_step, cfg.data.drop_last)
    if was != now and (run.data.drop_last or cfg.data.drop_last):
        raise ConfigError(
            f"train.prompts_per_step and data.drop_last were {was[0]} and {str(was[1]).lower()} when the run in "
            f"{str(run_dir)!r} was trained and are {now[0]} and {str(now[1]).lower()} now; with whole batches an "
            "epoch is the whole batches of the order, so the checkpoint's data position would land elsewhere; "
            f"resume with train.prompts_per_step={was[0]} and data.drop_last={str(was[1]).lower()}, or start a new run"
        )


def _same_folder(a: str, b: str) -> bool:
    """Two model paths that lead to one existing folder."""
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.is_dir() and pb.is_dir() and pa.resolve() == pb.resolve()


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
        atomic_write(run_dir / CONFIG_FILE, sealed(yaml.safe_dump(to_dict(cfg), sort_keys=False)))
        return
    changed = config_changes(load_run_config(run_dir), cfg)
    if changed:
        history = _history(run_dir) + [{"step": resume_step, "changed": changed}]
        atomic_write(run_dir / HISTORY_FILE, sealed(yaml.safe_dump(history, sort_keys=False)))


def config_changes(before: Config, after: Config) -> dict[str, dict[str, Any]]:
    """``{"section.field": {"from": old, "to": new}}`` for every field that differs."""
    a, b = to_dict(before), to_dict(after)
    return {f"{s}.{k}": {"from": a[s].get(k), "to": v} for s in b for k, v in b[s].items() if a.get(s, {}).get(k) != v}


def set_aside_later(run_dir: Path, resumed: Path, log=print) -> Path | None:
    """A resume from ``resumed``, an earlier checkpoint than the run's newest: the later checkpoints (another
    continuation of the run) move to ``earlier-runs/<time>/`` with a copy of the run's records as they are
    (set_aside), so the run folder holds one history and nothing is lost. Returns that folder (None: no later one)."""
    later = [
        p
        for p in sorted((run_dir / "checkpoints").glob(f"{checkpoint.PREFIX}*"))
        if p.is_dir() and step_of(p) > step_of(resumed)
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
    said = str(Path(f).resolve())  # once per file, not per spelling: "run/config.yaml" names another file elsewhere
    if not checked and said not in _UNSEALED_SAID and os.environ.get("RANK", "0") == "0":
        _UNSEALED_SAID.add(said)
        print(
            f"grpokit: warning: {f} has no checksum line (written by a grpokit from before run-file checksums), "
            "so damage to it cannot be detected; it is read as it is",
            flush=True,
        )
    return text


def atomic_write(path: Path, text: str) -> None:
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
