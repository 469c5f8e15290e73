"""Which checkpoint of a run folder a reader gets: one rule for every reader of a run's weights.

``grpokit train --resume RUN``, ``grpokit eval --model RUN`` and a model (or a distillation teacher) loaded
from a checkpoint's ``model/`` folder all pick through ``pick``:

* a run folder gives its newest checkpoint that verifies against its manifest (checkpoint.verify), each
  newer one skipped named with its fault, so a damaged checkpoint is never read, whichever command reads it
  (an evaluation of flipped weights once blamed the model for NaN log-probabilities);
* a checkpoint named by the user (``RUN/checkpoints/step-N``, its ``model/`` or ``adapter/`` folder, or TRL's
  ``checkpoint-N`` link to it) gives exactly that one, refused in one sentence when it does not verify,
  never another in its place.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpokit.config.base import ConfigError

from . import checkpoint


@dataclass(frozen=True)
class Reader:
    """Who reads the checkpoint, for its sentences."""

    flag: str
    """How the user named the run: "--resume", "--model"."""
    verb: str
    """What is done with the checkpoint: "resume from", "evaluate", "load"."""
    doing: str
    """The same, going on: "resuming from", "evaluating", "loading"."""
    instead: str
    """What to name instead of a damaged checkpoint."""


RESUME = Reader(
    "--resume", "resume from", "resuming from", "the run folder to resume from its newest one that verifies"
)
EVAL = Reader("--model", "evaluate", "evaluating", "the run folder to evaluate its newest one that verifies")
LOAD = Reader("model.name_or_path", "load", "loading", "another model folder")


def checkpoint_folder(path: Path) -> tuple[Path, Path] | None:
    """``(run folder, checkpoint)`` when ``path`` is a grpokit checkpoint folder ``<run>/checkpoints/step-N``, its
    ``model/`` or ``adapter/`` folder (a link to one, TRL's ``checkpoint-N``, resolved first), else None."""
    p = Path(path).resolve()
    if p.name in ("model", "adapter"):
        p = p.parent
    if p.name.startswith(checkpoint.PREFIX) and p.parent.name == "checkpoints":
        return p.parent.parent, p
    return None


def has_checkpoints(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds any step checkpoint (complete or not; interrupted saves do not count)."""
    ckpts = Path(run_dir) / "checkpoints"
    return ckpts.is_dir() and any(p.is_dir() for p in ckpts.glob(f"{checkpoint.PREFIX}*"))


def step_of(folder: Path) -> int:
    """The step of a checkpoint folder ``step-000123`` (-1 for a name that holds none)."""
    digits = Path(folder).name[len(checkpoint.PREFIX) :]
    return int(digits) if digits.isdigit() else -1


def newest_verified(ckpt_dir: Path, log=None, *, model_only_ok: bool = False, reader: Reader = RESUME) -> Path | None:
    """The newest checkpoint under ``ckpt_dir`` that verifies (``log`` hears of each one skipped, and
    which one is used then). A checkpoint without a manifest is taken for one written before manifests
    existed only when no older checkpoint has one (checkpoint.verify); ``model_only_ok``: the reader needs no
    optimizer and random states (a model-only save, an evaluation)."""
    found = _listed(ckpt_dir)
    # a save writes its manifest since issue 26: a checkpoint after one that has it must have it too
    first_listed = next((i for i, p in enumerate(found) if checkpoint.has_manifest(p)), len(found))
    skipped = 0
    for i in range(len(found) - 1, -1, -1):
        p = found[i]
        fault = checkpoint.verify(p, model_only_ok=model_only_ok, legacy_ok=i < first_listed)
        if fault is None:
            if log is not None and skipped:
                log(f"grpokit: {reader.doing} {p}, the newest checkpoint that verifies whole", flush=True)
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


def pick(
    run_dir: Path, log=print, *, model_only_ok: bool = False, at: Path | None = None, reader: Reader = RESUME
) -> Path:
    """The checkpoint of ``run_dir`` that ``reader`` reads: its newest that verifies, each newer one skipped
    named with its fault; ``at`` (a checkpoint named by the user): that one, refused in one sentence if it does
    not verify, never another in its place."""
    found = (
        _named(run_dir, Path(at), model_only_ok, reader)
        if at is not None
        else newest_verified(run_dir / "checkpoints", log, model_only_ok=model_only_ok, reader=reader)
    )
    if found is not None:
        _VERIFIED.add(found.resolve())
        return found
    raise ConfigError(
        f"{reader.flag} {str(run_dir)!r} has no complete checkpoint under checkpoints/ that verifies; nothing to "
        f"{reader.verb.removesuffix(' from')}"
    )


def _named(run_dir: Path, at: Path, model_only_ok: bool, reader: Reader) -> Path:
    found = _listed(run_dir / "checkpoints")
    if not at.is_dir():
        raise ConfigError(
            f"the checkpoint to {reader.verb}, {str(at)!r}, does not exist; name one of "
            f"{[p.name for p in found] or 'the run checkpoints (it has none)'} or the run folder for its newest"
        )
    index = [p.name for p in found].index(at.name) if at.name in {p.name for p in found} else 0
    first_listed = next((i for i, p in enumerate(found) if checkpoint.has_manifest(p)), len(found))
    fault = checkpoint.verify(at, model_only_ok=model_only_ok, legacy_ok=index < first_listed)
    if fault is not None:
        raise ConfigError(
            f"the checkpoint to {reader.verb}, {str(at)!r}, is damaged ({fault}); name another checkpoint, or "
            f"{reader.instead}"
        )
    return at


def verify_model_folder(path: str | Path) -> None:
    """A model folder inside a run's checkpoint (model.name_or_path=RUN/checkpoints/step-N/model, a teacher, TRL's
    checkpoint-N) is read only when its checkpoint verifies: refused in one sentence otherwise. Any other folder
    passes. A checkpoint is verified once per process (its sha256 sums read every file)."""
    named = checkpoint_folder(Path(path)) if Path(path).is_dir() else None
    if named is not None and named[1] not in _VERIFIED:
        pick(named[0], at=named[1], model_only_ok=True, reader=LOAD)


_VERIFIED: set[Path] = set()  # the checkpoints (resolved) ``pick`` found whole in this process


def _listed(ckpt_dir: Path) -> list[Path]:
    return sorted(p for p in ckpt_dir.glob(f"{checkpoint.PREFIX}*") if p.is_dir())
