"""Checkpoints that survive SIGKILL at any moment, and resume that reproduces the run exactly.

A checkpoint is a folder ``checkpoints/step-000123/`` holding

* ``model/``: the policy in Hugging Face format (safetensors + config + tokenizer), loadable by
  ``AutoModelForCausalLM.from_pretrained`` as is;
* ``optimizer.pt``: optimizer and learning-rate schedule state;
* ``rng.pt``: the Python, NumPy and torch RNG states and the rollout sampler's generator
  (neither of these two with ``train.save_only_model``: such a checkpoint resumes with the weights,
  a fresh optimizer and schedule and the current random state, as transformers' save_only_model);
* ``trainer_state.json``: the step, the optimizer updates and slices trained (a step may end between two of its
  updates: train.max_updates, a callback's stop), the data position and the training prompts' fingerprint;
* ``extra_state.pt`` (only when a variant has state of its own): e.g. lambda-GRPO's lambda, an
  optimizer update still accumulating when the step ended (train.accumulation_slices), or the reference
  model refreshed by algo.ref_refresh_every (its weights, unless it is a copy of this checkpoint's policy).
* ``model/README.md``: a model card (base model, data, rewards, the settings that shape training,
  held-out results of the final checkpoint), as the Hub shows it (train/model_card.py).

It is written under a temporary name and renamed into place only when complete (a rename is atomic
on POSIX), so a kill mid-write leaves either the previous checkpoints or the new one, never half of
one. The last file written is ``manifest.json`` (every other file's size and sha256, and whether the save
was model-only): ``verify`` checks a checkpoint against it, so a checkpoint damaged after the fact (a
truncated or deleted file, a disk fault, a copy cut short) is recognised, and every reader of a run's
weights (resume, eval, a model loaded from a checkpoint) falls back to the newest one that verifies or
refuses the one named (train/run_checkpoints.py). A failed write
(ENOSPC) removes the temporary folder and leaves every earlier checkpoint as it was.

A checkpoint without ``manifest.json`` is trusted only as one written before manifests existed
(``legacy_ok``): its ``trainer_state.json`` does not say it has a manifest, it holds every file a
save writes (optimizer.pt and rng.pt too, unless the run asked for model-only saves), and no older
checkpoint of the run has a manifest. Otherwise it is damaged: a partial checkpoint is never
completed with a fresh optimizer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from grpokit.config.sections import ConfigError

from .faults import storage_error

log = logging.getLogger("grpokit.checkpoint")
PREFIX = "step-"
MANIFEST = "manifest.json"


@dataclass
class TrainerState:
    step: int
    data_position: int
    data: dict | None = None  # the training prompts' identity (data/prompts.py fingerprint); None: an older checkpoint
    numerics: dict | None = None  # what its sums depended on (train/numerics.py); None: an older checkpoint
    updates: int | None = None  # optimizer updates applied (TRL's global_step); None: an older checkpoint
    slices: int | None = None  # slices trained: the next one's place in the stream of update windows; None: older
    round_left: int = 0  # slices of the last step's batch left untrained (train.max_updates or a stop inside it)


def save(
    ckpt_dir: Path,
    state: TrainerState,
    model,
    tokenizer,
    optimizer,
    scheduler,
    generator: torch.Generator,
    keep: int,
    *,
    write_model=None,
    sampler_states: list | None = None,
    optimizer_state: dict | None = None,
    extra_state: dict | None = None,
    card: str | None = None,
    model_only: bool = False,
    protect: Path | None = None,
) -> Path:
    """Write a checkpoint. ``write_model(model, folder)`` replaces the plain ``save_pretrained`` into
    ``folder/model`` (LoRA adapters, FSDP gathered weights); ``sampler_states`` holds every rank's
    sampling generator state; ``optimizer_state`` replaces ``optimizer.state_dict()`` (FSDP);
    ``extra_state`` (e.g. lambda-GRPO's lambda and its optimizer) goes to ``extra_state.pt``;
    ``card`` becomes ``model/README.md`` (replacing the one PEFT writes for adapters); ``model_only``
    leaves out optimizer.pt and rng.pt; ``protect`` is a checkpoint the rotation keeps (rotate)."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"{PREFIX}{state.step:06d}"
    tmp = ckpt_dir / f".tmp-{PREFIX}{state.step:06d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _write_files(
            tmp,
            state,
            model,
            tokenizer,
            None if model_only else optimizer,
            scheduler,
            generator,
            write_model,
            sampler_states,
            optimizer_state,
            extra_state,
            card,
            model_only,
        )
    except BaseException as exc:  # ENOSPC, a failed serialiser, Ctrl-C: no half checkpoint stays behind
        refused = storage_error(exc, final) if isinstance(exc, Exception) else None  # asked before the space is freed
        shutil.rmtree(tmp, ignore_errors=True)
        if refused is not None and not (isinstance(exc, OSError) and exc.errno == refused.errno):
            # a full disk seen through safetensors or torch.save: an OSError naming the checkpoint
            raise refused from exc
        raise
    if final.exists():  # re-saving the same step (e.g. the final save right after a periodic one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_dir)
    for old in rotate(sorted(ckpt_dir.glob(f"{PREFIX}*")), keep, protect):
        shutil.rmtree(old, ignore_errors=True)
    return final


def rotate(done: list[Path], keep: int, protect: Path | None = None) -> list[Path]:
    """The checkpoints (oldest first) to delete so that ``keep`` remain. A ``protect``ed one survives:
    it takes the place before the newest, and with keep=1 it is kept beside the newest (transformers'
    rotation with load_best_model_at_end)."""
    if protect is None or protect not in done or protect == done[-1]:
        return done[:-keep]
    order = [p for p in done if p != protect]
    order.insert(max(0, len(order) - 1), protect)
    return order[: -max(keep, 2 if order[-1] != protect else keep)]


def _write_files(
    tmp: Path,
    state: TrainerState,
    model,
    tokenizer,
    optimizer,
    scheduler,
    generator,
    write_model,
    sampler_states,
    optimizer_state,
    extra_state,
    card,
    model_only: bool = False,
) -> None:
    if write_model is not None:
        write_model(model, tmp)
    else:
        model.save_pretrained(tmp / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "model")
    if card is not None:
        (tmp / "model" / "README.md").write_text(card)
    if optimizer is not None:  # None: save_only_model, the weights alone
        torch.save(
            {
                "optimizer": optimizer_state if optimizer_state is not None else optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
            },
            tmp / "optimizer.pt",
        )
        torch.save({**rng_state(generator), "sampler_ranks": sampler_states}, tmp / "rng.pt")
    if extra_state is not None:
        torch.save(extra_state, tmp / "extra_state.pt")
    # "manifest": a checkpoint whose manifest.json went missing is known damaged, not taken for an old one
    (tmp / "trainer_state.json").write_text(json.dumps({**state.__dict__, "manifest": True}))
    _fsync_tree(tmp)
    with open(tmp / MANIFEST, "w") as f:  # last: its presence means every other file is complete
        f.write(json.dumps({**manifest(tmp), "model_only": optimizer is None}, indent=1))
        f.flush()
        os.fsync(f.fileno())


def manifest(folder: Path) -> dict[str, dict]:
    """``{relative path: {"size": bytes, "sha256": hex}}`` of every file under ``folder`` but the manifest."""
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            files[p.relative_to(folder).as_posix()] = {"size": p.stat().st_size, "sha256": _sha256(p)}
    return {"files": files}


def verify(path: Path, *, model_only_ok: bool = False, legacy_ok: bool = True) -> str | None:
    """None when the checkpoint at ``path`` matches its manifest, else why not (one phrase).
    Without a manifest it verifies only as a checkpoint from before manifests (``legacy_ok``, see the
    module docstring); ``model_only_ok``: the run asked for model-only saves (train.save_only_model)."""
    m = path / MANIFEST
    if not m.exists():
        return _verify_unlisted(path, model_only_ok, legacy_ok)
    try:
        data = json.loads(m.read_text())
        files = data["files"]
        listed = {rel: (int(w["size"]), str(w["sha256"])) for rel, w in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return "its manifest.json is unreadable"
    for rel, (size, sha) in listed.items():
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != size:
            return f"{rel} has {f.stat().st_size} bytes, the manifest says {size}"
        if _sha256(f) != sha:
            return f"{rel} does not match its sha256 in the manifest"
    need = ["trainer_state.json"] + ([] if data.get("model_only", True) else ["optimizer.pt", "rng.pt"])
    absent = [n for n in need if n not in listed]
    return f"its manifest does not list {', '.join(absent)}" if absent else None


def _verify_unlisted(path: Path, model_only_ok: bool, legacy_ok: bool) -> str | None:
    """A checkpoint without manifest.json: one from before manifests existed, whole, or a damaged one."""
    state = path / "trainer_state.json"
    if not state.is_file():
        return "it has no manifest.json and no trainer_state.json"
    try:
        written_with_manifest = bool(json.loads(state.read_text()).get("manifest"))
    except (ValueError, AttributeError, UnicodeDecodeError):
        return "it has no manifest.json and its trainer_state.json is unreadable"
    if written_with_manifest or not legacy_ok:
        return "its manifest.json is missing (every save writes it last), so its files cannot be trusted"
    if not any((path / "model").glob("*.safetensors")):
        return "it has no manifest.json and no weights under model/"
    missing = [n for n in ("optimizer.pt", "rng.pt") if not (path / n).is_file()]
    if missing and not model_only_ok:
        return (
            f"it has no manifest.json and {', '.join(missing)} is missing, though the run did not ask for "
            "model-only saves (train.save_only_model)"
        )
    return None


def has_manifest(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load(
    path: Path,
    model,
    optimizer,
    scheduler,
    generator: torch.Generator,
    *,
    read_model=None,
    rank: int = 0,
    load_optimizer=None,
) -> TrainerState:
    """Restore a checkpoint; ``read_model(model, path)`` / ``load_optimizer(optimizer, state)`` replace
    the plain loaders (LoRA, FSDP); ``rank`` picks this rank's sampling generator state."""
    load_model(path, model, read_model=read_model)
    return _load_rest(path, optimizer, scheduler, generator, rank, load_optimizer)


def load_model(path: Path, model, *, read_model=None) -> None:
    """Load the policy weights of the checkpoint at ``path`` into ``model`` (``read_model``: LoRA, FSDP)."""
    from safetensors.torch import load_file

    if read_model is not None:
        read_model(model, path)
        return
    weights = {}
    for f in sorted((path / "model").glob("*.safetensors")):
        weights.update(load_file(str(f), device=str(next(model.parameters()).device)))
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # shapes differ: "size mismatch for model.embed_tokens.weight: ..."
        detail = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), str(e).splitlines()[0])
        raise CheckpointMismatch(_mismatch(path, detail[:300])) from None
    tied = {k for k in missing if "lm_head" in k or "embed" in k}
    if unexpected or set(missing) - tied:
        extra = set(missing) - tied
        raise CheckpointMismatch(
            _mismatch(
                path,
                f"{len(extra)} of the model's weights are not in it, e.g. {sorted(extra)[:2]}, "
                f"and {len(unexpected)} of its weights are not in the model, e.g. {sorted(unexpected)[:2]}",
            )
        )


class CheckpointMismatch(ConfigError):
    """A checkpoint holds another model's weights than the one loaded (a resume with another model)."""


def _mismatch(path: Path, detail: str) -> str:
    run = path.parent.parent
    return (
        f"checkpoint {path} holds the weights of another model than the one loaded ({detail}); resume with the "
        f"model the run was trained with (model.name_or_path in {run / 'config.yaml'}) or start a new run"
    )


def load_extra(path: Path) -> dict:
    """The ``extra_state`` a checkpoint was saved with ({} when it has none)."""
    f = path / "extra_state.pt"
    return torch.load(f, weights_only=False) if f.exists() else {}


def _load_rest(path: Path, optimizer, scheduler, generator: torch.Generator, rank: int, load_optimizer) -> TrainerState:
    saved = json.loads((path / "trainer_state.json").read_text())
    state = TrainerState(**{f.name: saved[f.name] for f in dataclasses.fields(TrainerState) if f.name in saved})
    if not (path / "optimizer.pt").exists():  # save_only_model: as transformers, the weights alone carry over
        # (``verify`` let it through only as a model-only save: the manifest's, or the run's setting)
        log.warning(
            "checkpoint %s holds no optimizer, schedule or RNG state (save_only_model): resuming with its weights, "
            "a fresh optimizer and learning-rate schedule",
            path,
        )
        return state
    opt = torch.load(path / "optimizer.pt", weights_only=False)
    configured = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups], scheduler.base_lrs
    if load_optimizer is not None:
        load_optimizer(optimizer, opt["optimizer"])
    else:
        optimizer.load_state_dict(opt["optimizer"])
    scheduler.load_state_dict(opt["scheduler"])
    keep_configured(optimizer, scheduler, *configured)
    rng = torch.load(path / "rng.pt", weights_only=False)
    ranks = rng.get("sampler_ranks")
    set_rng_state({**rng, "sampler": ranks[rank] if ranks and rank < len(ranks) else rng["sampler"]}, generator)
    return state


def keep_configured(optimizer, scheduler, groups: list[dict], base_lrs: list[float]) -> None:
    """After a checkpoint's optimizer and schedule are loaded, the hyperparameters the run's config gives now
    (``groups``, ``base_lrs``: the freshly built optimizer's and schedule's) replace the checkpoint's where they
    differ: a resume with ``optim.lr`` or ``optim.weight_decay`` changed (recorded in config_history.yaml) trains
    with the new values from the checkpoint's step on, the schedule's multiplier at that step applied to the new
    rate. The moments and the step count stay the checkpoint's; unchanged values leave the resume bit-exact (the
    same rate by the same formula)."""
    for group, fresh in zip(optimizer.param_groups, groups):
        for key, value in fresh.items():
            if key not in ("lr", "initial_lr") and group.get(key) != value:
                group[key] = value
    scheduler.base_lrs = list(base_lrs)  # the rate at the checkpoint's step by today's schedule: a run extended
    # (train.steps, optim.schedule_steps) has a longer schedule than the one whose last rate the checkpoint holds
    lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(base_lrs, scheduler.lr_lambdas)]
    for group, base, lr in zip(optimizer.param_groups, base_lrs, lrs):
        group["initial_lr"], group["lr"] = base, lr
    scheduler._last_lr = lrs  # what get_last_lr() reads (torch keeps it there, a private name)


def rng_state(generator: torch.Generator) -> dict:
    """Every random state a run draws from: Python's, NumPy's, torch's (CPU and CUDA) and the sampler's."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "sampler": generator.get_state(),
    }


def set_rng_state(rng: dict, generator: torch.Generator) -> None:
    """Put back what ``rng_state`` took."""
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    generator.set_state(rng["sampler"])


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(root)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
