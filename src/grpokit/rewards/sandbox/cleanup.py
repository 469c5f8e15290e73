"""No orphans: what a trainer killed mid-call (SIGKILL, the OOM killer) leaves behind is removed.

Processes die with the trainer: the launcher asks the kernel to SIGKILL it when the thread that
started it ends (PR_SET_PDEATHSIG, checked against a trainer that died before the request), bwrap runs
with --die-with-parent, and the kernel kills every process of the sandbox's PID namespace when its
init dies. A reward worker killed at its timeout is such a trainer too.

Job folders and sandbox cgroups cannot delete themselves when their owner is killed, so the first
sandboxed call of any grpokit process on the machine, and one every ``SWEEP_EVERY_S`` after, removes
those of owners that are gone (``sweep_stale_jobs``, ``sweep_stale_cgroups``; ``sweep_when_due``). An
owner is gone when nobody holds the folder's ``flock``: its owner takes it before the folder gets its
``grpokit-job-PID-`` name (a cgroup: right after its ``mkdir``, so one is swept only once it is older
than ``CGROUP_GRACE_S``), and the kernel drops it when the owner dies. The pid in a name is for people
reading the folder; it decides nothing. The lock is what makes this safe between PID namespaces that
share a temp folder or a cgroup tree (containers, a cluster's jobs): a pid names a different process, or
none, in each of them, so a live trainer's folder was once removed under it by a neighbour that could
not see its pid. Orphan cgroups also held a name a later process of the same pid would choose: once 124
had gathered on one host, a reused pid stopped a run's code reward with "File exists".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

from . import budget, uids

JOB_PREFIX = "grpokit-job-"
STAGING_PREFIX = "grpokit-new-"  # a job folder before it is locked and named; a leftover is removed when old
STAGING_GRACE_S = 600.0
CGROUP_GRACE_S = 60.0  # a sandbox cgroup younger than this is never swept: its creator may be between mkdir and flock
_JOB_RE = re.compile(re.escape(JOB_PREFIX) + r"(\d+)-")
SWEEP_EVERY_S = 600.0  # a long run sweeps again this often: a trainer killed just before it started left
# cgroups still inside their grace at its first call (a cluster's requeue restarts within seconds)
_sweep_lock = threading.Lock()
_next_sweep: list[float] = [0.0]  # time.monotonic() from which the next sandboxed call sweeps
_clock = time.monotonic  # the clock of _next_sweep (tests move their own)


def job_prefix() -> str:
    """The prefix of this process's job folders (its pid inside, for ``sweep_stale_jobs``)."""
    return f"{JOB_PREFIX}{os.getpid()}-"


@contextlib.contextmanager
def job_folder() -> Iterator[str]:
    """A fresh private folder named ``job_prefix()...``, locked for as long as it exists, then removed."""
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX)
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # before the name that sweeps look at: never seen unlocked while alive
        path = os.path.join(os.path.dirname(staging), job_prefix() + os.path.basename(staging)[len(STAGING_PREFIX) :])
        os.rename(staging, path)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # only when the rename never happened
        os.close(fd)


def _unlocked(path: str) -> bool:
    """Nobody holds ``path``'s flock (its owner is gone); False when it is held or cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def sweep_stale_jobs(folder: str | None = None) -> list[str]:
    """Remove job folders (ours: same uid) whose owner process is gone; returns the removed paths."""
    folder = folder or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(folder, name)
        if _stale(name, path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _stale(name: str, path: str) -> bool:
    """A job folder of ours whose owner is gone, or a staging folder of ours left long ago."""
    m = _JOB_RE.match(name)
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if st.st_uid != os.geteuid() or not (m or name.startswith(STAGING_PREFIX)):
        return False
    if not m:  # its owner died between creating and naming it, or is in that microsecond now
        return time.time() - st.st_mtime > STAGING_GRACE_S and _unlocked(path)
    return _unlocked(path)


def sandbox_cgroups() -> list[tuple[str, str]]:
    """(controller, folder) of every sandbox cgroup below this process's own, trees first (a cpu folder
    lists no members): the unified (v2) folder, else the v1 pids, memory and cpu folders."""
    v2, v1 = budget._parents()
    parents = [("unified", v2)] if v2 else []
    parents += [(c, v1[c]) for c in ("pids", "memory", "cpu") if c in v1]
    found = []
    for controller, parent in parents:
        try:
            found += [(controller, os.path.join(parent, n)) for n in os.listdir(parent) if n.startswith(budget.PREFIX)]
        except OSError:
            continue
    return found


def sweep_stale_cgroups() -> list[str]:
    """Kill what is left in, and remove, the sandbox cgroups whose creator is gone (nobody holds their
    flock, and they are older than ``CGROUP_GRACE_S``); returns the removed folders."""
    removed = []
    for controller, path in sandbox_cgroups():
        try:
            young = time.time() - os.stat(path).st_ctime < CGROUP_GRACE_S
        except OSError:
            continue
        if young or not _unlocked(path):
            continue
        orphan = budget.Cgroup("cgroup2" if controller == "unified" else "cgroup1", {controller: path})
        orphan.remove()  # kills what is left in it first (a trainer's death may not have taken everything along)
        if not os.path.exists(path):
            removed.append(path)
    return removed


def sweep_when_due() -> None:
    """``sweep_stale_jobs``, ``sweep_stale_cgroups`` and ``uids.sweep_stale`` at this process's first
    sandboxed call, and again at the first one ``SWEEP_EVERY_S`` after the last sweep."""
    with _sweep_lock:
        now = _clock()
        if now < _next_sweep[0]:
            return
        _next_sweep[0] = now + SWEEP_EVERY_S
    sweep_stale_jobs()
    sweep_stale_cgroups()
    if os.geteuid() == 0:  # only root's sandboxes take uids
        uids.sweep_stale()
