"""Nothing a reward, tool or environment starts outlives its call, or at the latest the run.

A reward function may start a process and leave it running, however detached: a plain child, a new
session (`setsid`), a double fork (the daemon's grandchild is orphaned at once). Linux re-parents an
orphan to the nearest ancestor that declared itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``),
else to pid 1, where nothing would ever end it. So:

- a reward worker process (rewards/pool_worker.py) is a subreaper, so whatever its calls start stays
  below it, detached or not; when the pool kills the worker (a deadline) or closes, everything below
  the worker is ended first (``end_below``);
- the trainer is a subreaper for the run (train/reaper.py); an untrusted call in the trainer's own
  process (an in-process reward, an environment reset, a tool call) runs inside ``watching()``, which
  notes the processes that became the trainer's children during it (what the call started, and its
  detached orphans re-parented to the trainer). When the run ends, on success, error or signal, those
  and everything below them are killed and reaped (``end_watched``), so none is left alive or a
  zombie. Processes trusted code starts during the run (a tracker's service, compile workers) are
  not the run's to end, and are left alone unless one starts inside an untrusted call's window.

Processes are known by (pid, start time), read from /proc, so a pid reused by an unrelated process is
never taken for one of ours. Linux only; elsewhere these are no-ops.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from typing import Iterator

PR_SET_CHILD_SUBREAPER = 36

Ident = tuple[int, int]  # (pid, start time in clock ticks since boot)
_watched: set[Ident] = set()
_watched_lock = threading.Lock()


def become_subreaper() -> bool:
    """Make orphans below this process re-parent to it; False where the kernel does not allow it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every process visible in /proc."""
    out: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            out[int(name)] = (int(fields[1]), int(fields[19]))  # ppid, starttime (fields 4 and 22)
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(root: int | None = None) -> set[Ident]:
    """Every process below ``root`` (this process by default), as (pid, start time)."""
    root = os.getpid() if root is None else root
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[Ident] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.add((pid, table[pid][1]))
        todo.extend(children.get(pid, []))
    return found


def _reap(pids: list[int]) -> None:
    """Collect the exit status of those of ``pids`` that are this process's children (no zombies)."""
    mine = os.getpid()
    table = _table()
    for pid in pids:
        if table.get(pid, (None,))[0] != mine:
            continue
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def children() -> set[Ident]:
    """This process's direct children (every thread's, /proc/self/task/*/children): cheap enough to
    read around every untrusted call."""
    pids: set[int] = set()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return set()
    if not os.path.exists(f"/proc/self/task/{tids[0]}/children"):  # a kernel without CONFIG_PROC_CHILDREN
        me = os.getpid()
        return {(pid, start) for pid, (ppid, start) in _table().items() if ppid == me}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/children", "rb") as f:
                pids.update(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return {(pid, start) for pid in pids if (start := _start_time(pid)) is not None}


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """Note the children this process gained during the body (an untrusted call): ``end_watched`` ends them."""
    before = children()
    try:
        yield
    finally:
        new = children() - before
        if new:
            with _watched_lock:
                _watched.update(new)


def end_watched(keep_pids: set[int] = frozenset()) -> list[int]:
    """Kill and reap the processes ``watching`` noted that still run, and everything below them;
    ``keep_pids`` (the workers of pools still open, such as the process-wide verifier pool that a
    call started) are kept, and what is below them is not."""
    with _watched_lock:
        noted = set(_watched)
        _watched.clear()
    table = _table()
    alive = [pid for pid, start in noted if table.get(pid, (None, None))[1] == start and pid not in keep_pids]
    for pid in keep_pids & {pid for pid, _ in noted}:
        end_below(pid)
    targets = sorted({*alive, *(pid for root in alive for pid, _ in descendants(root))})
    return _end(targets)


def end_below(root: int) -> list[int]:
    """Kill and reap every process below ``root`` (a reward worker about to be killed or closed)."""
    return _end(sorted(pid for pid, _ in descendants(root)))


def _end(targets: list[int]) -> list[int]:
    ended = []
    for pid in targets:
        try:
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    _reap(targets)
    return ended
