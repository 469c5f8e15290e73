"""No orphans: what a trainer killed mid-call (SIGKILL, the OOM killer) leaves behind is removed.

Processes die with the trainer: the launcher asks the kernel to SIGKILL it when the thread that
started it ends (PR_SET_PDEATHSIG, checked against a trainer that died before the request), bwrap runs
with --die-with-parent, and the kernel kills every process of the sandbox's PID namespace when its
init dies. A reward worker killed at its timeout is such a trainer too.

Job folders cannot delete themselves when their owner is killed, so each is named after its owner's
pid (``grpokit-job-PID-...`` in the temp folder) and the next sandboxed call of any grpokit process on
the machine removes the folders of owners that are no longer alive (``sweep_stale_jobs``).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading

JOB_PREFIX = "grpokit-job-"
_JOB_RE = re.compile(re.escape(JOB_PREFIX) + r"(\d+)-")
_swept = threading.Event()


def job_prefix() -> str:
    """The prefix of this process's job folders (its pid inside, for ``sweep_stale_jobs``)."""
    return f"{JOB_PREFIX}{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def sweep_stale_jobs(folder: str | None = None) -> list[str]:
    """Remove job folders (ours: same uid) whose owner process is gone; returns the removed paths."""
    folder = folder or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = _JOB_RE.match(name)
        path = os.path.join(folder, name)
        try:
            if not m or os.lstat(path).st_uid != os.geteuid() or _alive(int(m.group(1))):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def sweep_once() -> None:
    """``sweep_stale_jobs`` at this process's first sandboxed call."""
    if not _swept.is_set():
        _swept.set()
        sweep_stale_jobs()
