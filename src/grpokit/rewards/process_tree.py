"""Nothing a reward, tool or environment starts outlives its call, or at the latest the run.

A reward function may start a process and leave it running, however detached: a plain child, a new
session (`setsid`), a double fork (the daemon's grandchild is orphaned at once). Linux re-parents an
orphan to the nearest ancestor that declared itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``),
else to pid 1, where nothing would ever end it. So:

- a reward worker process (rewards/pool_worker.py) is a subreaper and, after each call, kills every
  process below it that its call started (``end_descendants``): its own open pools' workers (a nested
  math-verify pool) are kept;
- the trainer is a subreaper for the run (train/reaper.py) and, when the run ends, on success, error
  or signal, kills every process below it started during the run, then reaps the ones that were
  re-parented to it, so none is left alive or a zombie.

Processes are known by (pid, start time), read from /proc, so a pid reused by an unrelated process is
never taken for one of ours. Linux only; elsewhere these are no-ops.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_CHILD_SUBREAPER = 36

Ident = tuple[int, int]  # (pid, start time in clock ticks since boot)


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


def end_descendants(keep: set[Ident] = frozenset(), keep_pids: set[int] = frozenset()) -> list[int]:
    """SIGKILL every process below this one except ``keep`` (and the pids in ``keep_pids``, whose own
    children are ended), then reap those that are now this process's children; the pids ended."""
    ended = []
    for _ in range(3):  # a process forking as it is swept: its child is found on the next pass
        targets = [pid for pid, start in descendants() if (pid, start) not in keep and pid not in keep_pids]
        if not targets:
            break
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        _reap(targets)
    return ended


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
