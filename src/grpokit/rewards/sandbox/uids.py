"""Fresh uids for root's sandboxes: one per running sandbox, across every trainer process of the host.

As root each sandbox runs as a uid of its own (isolation.py), so that RLIMIT_NPROC counts only that
sandbox's processes: a fork bomb stops at its own limit, never at a neighbour's. That holds only while
no two running sandboxes share a uid, and the neighbours may be in other processes: two torchrun ranks
on one node, or two runs on one machine. So a uid is taken by an exclusive ``flock`` on a file named
after it in a root-only folder (``FOLDER``), held for the sandbox's life and removed with it; the
kernel lets the lock go when the process dies, so a killed trainer never keeps a uid (its empty lock
file stays until ``sweep_stale``, run by cleanup.sweep_when_due, removes it). Where that
folder cannot be trusted (not this user's, or writable by others), only this process's own
sandboxes are kept apart, and a warning says so.

The starting point of the search comes from the operating system's randomness, never from Python's
``random``: the trainer seeds that (every rank alike), and a draw from it here would both give every
rank the same uids and move the random state a checkpoint saves.
"""

from __future__ import annotations

import fcntl
import os
import random
import stat
import threading
import warnings

from .budget import BudgetError

FIRST, COUNT = 200_000, 60_000  # uids 200000-259999: above any account's, below 2**31
FOLDER = "/run/grpokit-sandbox-uids" if os.path.isdir("/run") else "/tmp/grpokit-sandbox-uids"
_system = random.SystemRandom()
_held: dict[int, int | None] = {}  # uid -> its lock file's descriptor (None: kept apart in this process only)
_lock = threading.Lock()
_warned = False


def _folder() -> str | None:
    """FOLDER, created root-only; None (after one warning) when it exists but others could write to it."""
    global _warned
    try:
        os.makedirs(FOLDER, mode=0o700, exist_ok=True)
        st = os.lstat(FOLDER)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            return FOLDER
    except OSError:
        pass
    if not _warned:
        _warned = True
        warnings.warn(
            f"{FOLDER} is not a folder only this user can write to, so sandbox uids are kept apart within "
            "this process only; remove it, or let this user create it.",
            stacklevel=3,
        )
    return None


def _try_lock(folder: str, uid: int) -> int | None:
    """The descriptor of ``uid``'s lock file, locked by this call; None when another process holds it."""
    path = os.path.join(folder, str(uid))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        mine, named = os.fstat(fd), os.stat(path)  # still the file of that name: not one a holder removed
        if (mine.st_dev, mine.st_ino) == (named.st_dev, named.st_ino):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def take() -> int:
    """A uid no running sandbox of this host uses; give it back with ``give_back``."""
    folder = _folder()
    start = _system.randrange(COUNT)
    with _lock:
        for step in range(COUNT):
            uid = FIRST + (start + step) % COUNT
            if uid in _held:
                continue
            fd = _try_lock(folder, uid) if folder is not None else None
            if folder is None or fd is not None:
                _held[uid] = fd
                return uid
    raise BudgetError(
        f"All {COUNT} sandbox uids ({FIRST}-{FIRST + COUNT - 1}) are in use on this host; "
        "lower the reward's max_parallel or run fewer trainers at once."
    )


def give_back(uid: int | None) -> None:
    """Release ``uid`` (taken by ``take``); None and a uid not held are ignored."""
    with _lock:
        fd = _held.pop(uid, None) if uid is not None else None
    if fd is not None:
        try:
            os.unlink(os.path.join(FOLDER, str(uid)))  # while locked: a later taker makes a new file
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)  # for a forked copy of the descriptor too
        os.close(fd)


def sweep_stale() -> list[int]:
    """Remove the lock files nobody holds (left by trainers killed with a uid taken); returns their uids.

    Each is locked before it is unlinked, so a live holder's is never touched, and a taker that opened the
    file just before finds, after locking, that the name no longer leads to it and tries the next uid."""
    folder = os.path.isdir(FOLDER) and _folder()
    removed = []
    for name in os.listdir(folder) if folder else []:
        with _lock:
            if not name.isdigit() or int(name) in _held:
                continue
            fd = _try_lock(folder, int(name))
        if fd is not None:
            try:
                os.unlink(os.path.join(folder, name))
                removed.append(int(name))
            except OSError:
                pass
            os.close(fd)
    return removed
