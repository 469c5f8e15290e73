"""Who writes a run folder, and whether that process is still alive: ``RUN_DIR/run.lock``.

train/run_lock.py keeps one writer per run folder with this file (what it holds, and why the kernel's
``flock``, the pid with its start time and a heartbeat each tell a live holder from a dead one, is its
docstring). The file is read here, below train/, so that the readers of a run folder judge its writer by
the same rules as the next writer does: the doctor, the report and ``report --watch`` tell a run still in
progress from one whose process died without a record (kill -9, the out-of-memory killer, a second
Ctrl-C, a machine that went down), which leaves run.lock behind (record/run_status.py). A reader only
reads: it takes no ``flock`` (a starting trainer would find it held and refuse) and writes nothing.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = "run.lock"
HEARTBEAT_S = 10.0
"""The holder touches its lock file this often (a background thread), wherever it runs."""
STALE_S = 60.0
"""A lock of another host (or boot, or PID namespace) whose time did not move for this long, watched by the
judge's own monotonic clock (``Heartbeat``), is a dead holder's."""


@dataclass(frozen=True)
class Holder:
    """What the lock file says about the process holding it."""

    pid: int
    host: str
    boot_id: str
    pid_ns: str
    pid_start: str
    started: str
    command: str

    def same_machine(self, other: Holder) -> bool:
        return (self.host, self.boot_id, self.pid_ns) == (other.host, other.boot_id, other.pid_ns)

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started}: {self.command}"


def this_process() -> Holder:
    return Holder(
        os.getpid(),
        socket.gethostname(),
        _read("/proc/sys/kernel/random/boot_id"),
        _pid_ns(),
        pid_start(os.getpid()) or "",
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        " ".join([_program()] + sys.argv[1:])[:300],
    )


def _program() -> str:
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    return "grpokit" if name in ("__main__.py", "app.py") else name


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _pid_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def pid_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None: no such process."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""  # alive, start time unknown (no /proc)
    return stat.rsplit(")", 1)[-1].split()[19]


def alive_here(h: Holder) -> bool:
    """A holder on this machine is alive: its pid exists and started when the lock says."""
    start = pid_start(h.pid)
    return start is not None and (not start or not h.pid_start or start == h.pid_start)


def holder_of(path: Path) -> Holder | None:
    """The holder a lock file names; None for a missing, empty or torn file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Holder(**{k: (int(data[k]) if k == "pid" else str(data[k])) for k in Holder.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Heartbeat:
    """Another host's lock watched over several looks, timed by this process's own monotonic clock: the lock's
    time is the filesystem's (on NFS, the server's clock), never compared with this machine's ``time.time()``,
    so clocks that disagree can neither make a live holder read dead nor a dead one live. train/run_lock.py's
    ``_watch`` (the next writer) and ``report --watch`` (run_status.py) both judge by it."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic):
        self.path, self._clock = Path(path), clock
        self._mtime: float | None = None
        self._since = clock()

    def moved(self) -> bool:
        """Look at the lock's time: True when it changed since the last look (never at the first); a lock that
        vanished or was replaced changed too."""
        try:
            mtime: float | None = os.stat(self.path).st_mtime
        except OSError:
            mtime = None
        first, changed = self._mtime is None, mtime != self._mtime
        if changed:
            self._mtime, self._since = mtime, self._clock()
        return changed and not first

    def still_s(self) -> float:
        """Seconds, by this process's clock, since the lock's time was first seen or last moved."""
        return self._clock() - self._since


def writer_gone(run_dir: Path, heartbeat: Heartbeat | None = None) -> str | None:
    """Why the process that run_dir's run.lock names is known to be gone (a phrase), or None: no lock file, an
    empty one (a holder still starting), or a holder alive or not to be judged from here. On this machine its
    pid and start time decide (as the next writer's rule without flock). Another host's is judged only by a
    ``heartbeat`` watched over several looks (``report --watch``): its time unmoved for ``STALE_S`` seconds of
    this process's own clock (six missed heartbeats) is a dead holder's; one look cannot tell (``remote_note``)."""
    path = Path(run_dir) / LOCK_FILE
    holder = holder_of(path)
    if holder is None:
        return None
    if holder.same_machine(this_process()):
        return None if alive_here(holder) else f"run.lock names {holder.describe()}, which is no longer running"
    if heartbeat is None:
        return None
    heartbeat.moved()
    if heartbeat.still_s() <= STALE_S:
        return None
    return (
        f"run.lock names {holder.describe()}, on another host or boot, whose heartbeat did not move for "
        f"{heartbeat.still_s():.0f} s (watched by this machine's own clock)"
    )


def remote_note(run_dir: Path) -> str:
    """For one look at a lock of another host: who holds it and how old its heartbeat reads by this machine's
    clock, said as no verdict ("" for a lock of this machine, or none). That age compares the filesystem's clock
    (the server's, on NFS) with this machine's, which may be minutes apart, and a reader writes nothing into the
    run folder to read the filesystem's own time (the next writer does, train/run_lock.py), so a one-shot reader
    calls the run running and says how to tell."""
    path = Path(run_dir) / LOCK_FILE
    holder = holder_of(path)
    if holder is None or holder.same_machine(this_process()):
        return ""
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return ""
    return (
        f"run.lock names {holder.describe()}, on another host or boot, with a heartbeat {age:.0f} s old by this "
        f"machine's clock (the hosts' clocks may disagree; `grpokit report --watch` tells a stopped heartbeat "
        f"after {STALE_S:.0f} s)"
    )
