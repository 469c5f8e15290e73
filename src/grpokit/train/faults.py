"""Faults by cause: the disk, the user's files, the model, the user's code, or grpokit itself (docs/FAULTS.md).

A run that stops must say what is wrong and where. Libraries often hide the cause: a full disk comes
out of safetensors as ``SafetensorError: ... No space left on device (os error 28)`` and out of
``torch.save`` as ``RuntimeError: ... file write failed``; a truncated weights file is a
``SafetensorError`` that names no file. ``classify`` reads an exception (and the ones it was raised
from) and returns the cause as one sentence, or None when it is none of these: only then is it
"an internal fault" (a bug of grpokit). Where the path is known, the place that reads or writes
names it (``storage_error`` for checkpoint writes, ``weights_error`` for model loads).

The model's fault is numbers that are not finite (NaN weights or activations: the rollout's
``FloatingPointError``, torch's sampler refusing a NaN distribution). The user's code is told from
grpokit's by the traceback: the innermost frame that is neither the standard library nor an
installed package is the code that raised; outside grpokit's own folder it is the user's (a plugin
advantage, an environment class, a callback), and it is named with its file and line.

Under torchrun, rank 0's own exception when another rank ended the job is a broken collective; the trainer
raises ``RankFailure`` (rank_failure.py) from it, naming the rank that failed and its error, and that is the
cause said.
"""

from __future__ import annotations

import errno
import os
import shutil
import sysconfig
import traceback
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .rank_failure import RankFailure

STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
_STORAGE_WORDS = {
    errno.ENOSPC: ("no space left on device", "os error 28", "storagefull"),
    errno.EDQUOT: ("disk quota exceeded", "os error 122"),
    errno.EROFS: ("read-only file system", "os error 30"),
}
_TORCH_WRITE = ("file write failed", "failed writing file", "unexpected pos")
_DAMAGED = (
    "deserializing header",
    "incomplete metadata",
    "header too large",
    "invalid header",
    "metadata incomplete",
    "error while deserializing",
)


@dataclass(frozen=True)
class Cause:
    """A fault that is not grpokit's: one sentence, and the exit status (2 the user's files, 1 the machine)."""

    sentence: str
    status: int


def chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or during (``__cause__``, ``__context__``)."""
    out: list[BaseException] = []
    while e is not None and e not in out and len(out) < 20:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def storage_errno(e: BaseException) -> int | None:
    """ENOSPC / EDQUOT / EROFS when ``e`` (or its cause) is a write refused by the disk, however wrapped."""
    for x in chain(e):
        if isinstance(x, OSError) and x.errno in STORAGE_ERRNOS:
            return x.errno
        text = str(x).lower()
        for code, words in _STORAGE_WORDS.items():
            if any(w in text for w in words):
                return code
    return None


def storage_error(e: BaseException, path: Path) -> OSError | None:
    """An OSError naming ``path`` for a failed write under it that the disk refused (a full disk,
    a quota, a read-only mount); torch's write errors carry no errno, so a full filesystem at
    ``path`` is asked for then (under 1 MiB free while the half-written files still hold their space)."""
    code = storage_errno(e)
    if code is None and any(w in str(x).lower() for x in chain(e) for w in _TORCH_WRITE) and _nearly_full(path):
        code = errno.ENOSPC
    return OSError(code, os.strerror(code), str(path)) if code is not None else None


def _nearly_full(path: Path) -> bool:
    try:
        return shutil.disk_usage(path).free < 2**20
    except OSError:
        return False


def is_damaged_weights(e: BaseException) -> bool:
    """A weights file that cannot be read: safetensors' header errors (a truncated or corrupt file)."""
    return any(type(x).__name__ == "SafetensorError" and any(w in str(x).lower() for w in _DAMAGED) for x in chain(e))


def classify(e: BaseException, where: Path | None = None) -> Cause | None:
    """The cause of ``e`` as one sentence when it is the user's files or the machine; None for a bug."""
    ranks = next((x for x in chain(e) if isinstance(x, RankFailure)), None)
    if ranks is not None:  # under torchrun: the rank whose error ended the job, and that error (its text may name a
        return Cause(str(ranks).rstrip().rstrip("."), 1)  # full disk or a file: it is that rank's, said as it is)
    code = storage_errno(e)
    if code is not None:
        os_err = next((x for x in chain(e) if isinstance(x, OSError) and x.filename), None)
        place = os_err.filename if os_err is not None else where or "the run folder"
        return Cause(f"writing {place} failed because the disk refused it ({os.strerror(code)})", 1)
    if is_damaged_weights(e):
        first = next(x for x in chain(e) if type(x).__name__ == "SafetensorError")
        return Cause(
            f"a .safetensors weights file{_under(where)} is damaged or truncated ({_line(first)}); "
            "copy or download the model again",
            2,
        )
    model = _model_fault(e)
    if model is not None:
        return model
    for x in chain(e):
        if type(x).__name__ == "RolloutWorkerError":  # rollout/async_workers.py: its message names the worker
            return Cause(f"{_line(x)}; grpokit train --resume continues from the last checkpoint", 1)
    for x in chain(e):
        if isinstance(x, (MemoryError,)) or type(x).__name__ == "OutOfMemoryError":
            return Cause(
                f"the machine ran out of memory ({type(x).__name__}: {_line(x)}); use a smaller batch "
                "(train.micro_batch_size, train.prompts_per_step) or model, or free memory",
                1,
            )
        if isinstance(x, PermissionError):
            return Cause(
                f"permission denied on {x.filename or where or 'a file'}; give a path this user may read and write", 2
            )
        if isinstance(x, FileNotFoundError) and x.filename:
            return Cause(f"{x.filename} does not exist; give a path to an existing file or folder", 2)
        if (
            isinstance(x, OSError)
            and x.filename
            and x.errno in (errno.EIO, errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG)
        ):
            return Cause(f"{x.filename}: {x.strerror}", 2 if x.errno != errno.EIO else 1)
    return _user_code_fault(e)


_NAN_SAMPLING = "probability tensor contains either `inf`, `nan` or element < 0"


def _model_fault(e: BaseException) -> Cause | None:
    """NaN or inf in the model's weights or activations: the model's fault, not grpokit's."""
    for x in chain(e):
        if isinstance(x, FloatingPointError):
            return Cause(_line(x).removeprefix("rollout: "), 2)
        if isinstance(x, RuntimeError) and _NAN_SAMPLING in str(x):
            return Cause(
                "the model's next-token probabilities are NaN or inf (torch: "
                f"{_NAN_SAMPLING}): its weights or activations hold NaN or inf (a diverged update, float16 overflow); "
                "resume from an earlier checkpoint with a lower optim.lr, or use model.dtype=bfloat16 or float32",
                2,
            )
    return None


def _user_code_fault(e: BaseException) -> Cause | None:
    """An exception raised by the user's code (see the module docstring), named with its place."""
    x: BaseException | None = e
    seen = 0
    while x is not None and seen < 20:  # raised from (``__cause__``): a wrapper's reason
        frame = raising_frame(x)
        if frame is not None and _origin(frame.filename) == "user":
            return Cause(
                f"your code raised {type(x).__name__}: {_line(x)} ({frame.filename}, line {frame.lineno}, in "
                f"{frame.name}); fix it and run again (--debug shows the traceback)",
                2,
            )
        x, seen = x.__cause__, seen + 1
    return None


def raising_frame(e: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of ``e``'s traceback that is neither the standard library nor a package."""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if _origin(frame.filename) != "library":
            return frame
    return None


def _origin(filename: str) -> str:
    """ "grpokit", "library" (the standard library, installed packages, code without a file) or "user"."""
    if not filename or filename.startswith("<"):
        return "library"
    real = os.path.realpath(filename)
    grpokit_dir, libraries = _roots()
    if real.startswith(grpokit_dir):
        return "grpokit"
    if real.startswith(libraries) or any(m in real for m in _LIBRARY_MARKS):
        return "library"
    return "user"


# installed packages anywhere, and code that libraries generate into files (torch.compile's kernels)
_LIBRARY_MARKS = ("site-packages", "dist-packages", "torchinductor_", f"{os.sep}triton{os.sep}")


@cache
def _roots() -> tuple[str, tuple[str, ...]]:
    package = Path(__file__).resolve().parents[1]  # src/grpokit (not `import grpokit`: the root imports train)
    paths = sysconfig.get_paths()
    libs = {os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return str(package) + os.sep, tuple(sorted(libs))


def _under(where: Path | None) -> str:
    return f" under {where}" if where else ""


def _line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else type(e).__name__
