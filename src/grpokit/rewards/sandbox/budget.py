"""One resource budget per sandbox: memory, tasks (processes + threads) and CPU for the whole tree.

rlimits alone are per process (RLIMIT_AS) or per uid (RLIMIT_NPROC): a program that forks six children
of 400 MB each holds 2.4 GB under a "512 MB" limit. `plan()` picks, once per process, the first way this
host offers to bound the *tree*:

- "cgroup2": a child cgroup per sandbox in a cgroup v2 tree where this process may create them
  (`$GRPOKIT_SANDBOX_CGROUP`, or its own cgroup when memory and pids are enabled below it): memory.max
  (swap 0), pids.max, cpu.max (one CPU, so the tree's CPU time is at most the wall-clock limit);
  cgroup.kill ends the whole tree.
- "cgroup1": the same with the v1 memory (limit + memsw), pids and cpu (CFS quota) controllers, below
  this process's own cgroups (needs write access: root on a host that mounts them read-write); the tree
  is ended by SIGKILL to every member until none is left.
- "rlimit" (no writable cgroup): tasks are capped by RLIMIT_NPROC for an identity only this sandbox has
  (a fresh uid as root; as non-root, the sandbox's own user namespace, which Linux >= 5.14 counts
  separately: the limit is set inside it, so it is not charged to the trainer's uid), and memory by an
  address-space limit of budget / tasks per process, so that the sum over the tree stays within the
  budget (fewer tasks when that share would fall below `RLIMIT_SHARE_BYTES`).

When none of these can hold the budget (non-root on a kernel older than 5.14 without a cgroup, no
`prlimit` binary, or a memory budget too small to share) `plan()` raises `BudgetError`, one sentence.
`Limits.budget` = "rlimit" forces the fallback (tests use it to cover both paths on one host).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from functools import lru_cache

RLIMIT_SHARE_BYTES = 64 * 2**20  # smallest address space per task in rlimit mode (Python + a thread needs ~24 MB)
MIN_TASKS = 4  # bwrap's init, the harness, the solution and one more
CPU_PERIOD_US = 100_000
PREFIX = "grpokit-sandbox-"  # + the creator's pid (for people reading the tree) + 16 random hex digits
_lock = threading.Lock()


class BudgetError(RuntimeError):
    """No mechanism on this host can hold a per-sandbox budget (the message says why and what would)."""


@dataclass(frozen=True)
class Plan:
    """How one sandbox's budget is held."""

    mechanism: str  # "cgroup2" | "cgroup1" | "rlimit"
    tasks: int  # processes + threads of the whole tree
    memory_bytes: int  # memory of the whole tree
    process_memory_bytes: int  # RLIMIT_AS of each process (memory_bytes / tasks in rlimit mode)
    cpus: float  # CPUs the tree may use at once (a cgroup's CPU quota; 0.0 = not bounded, rlimit mode)


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = os.uname().release.split(".")
        return (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= (major, minor)
    except (ValueError, IndexError):
        return False


def plan(memory_bytes: int, tasks: int, cpus: float, budget: str = "auto", isolated: bool = True) -> Plan:
    """The mechanism and the numbers for one sandbox; raises BudgetError when none can hold them."""
    if budget not in ("auto", "rlimit"):
        raise ValueError(f"Limits.budget must be 'auto' or 'rlimit', got {budget!r}.")
    mech = mechanism() if budget == "auto" else None
    if mech is not None:
        return Plan(mech, tasks, memory_bytes, memory_bytes, cpus)
    fits = min(tasks, memory_bytes // RLIMIT_SHARE_BYTES)
    if isolated and fits < MIN_TASKS:
        raise BudgetError(
            f"A sandbox memory budget of {memory_bytes // 2**20} MB cannot be shared by at least {MIN_TASKS} "
            f"processes of {RLIMIT_SHARE_BYTES // 2**20} MB without a cgroup on this host; use memory_mb >= "
            f"{MIN_TASKS * RLIMIT_SHARE_BYTES // 2**20} or give the trainer a writable cgroup."
        )
    if isolated and os.geteuid() != 0:
        if not _kernel_at_least(5, 14):
            raise BudgetError(
                f"Without root or a writable cgroup, Linux {os.uname().release} charges every sandbox's "
                "processes to the trainer's uid, so no per-sandbox process budget can hold; run as root, "
                "set GRPOKIT_SANDBOX_CGROUP to a delegated cgroup v2 folder, or use Linux >= 5.14."
            )
        if not os.path.exists("/usr/bin/prlimit"):
            raise BudgetError(
                "Without root or a writable cgroup the sandbox sets its process limit with "
                "/usr/bin/prlimit, which is missing; install util-linux."
            )
    fits = max(fits, 1)
    return Plan("rlimit", fits, memory_bytes, memory_bytes // fits, 0.0)


# -- cgroups ----------------------------------------------------------------------------------------


def _mounts() -> dict[str, tuple[str, str]]:
    """controller (or "unified") -> (mount point, root inside the hierarchy), from mountinfo."""
    found: dict[str, tuple[str, str]] = {}
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        if rfields[0] == "cgroup2":
            found.setdefault("unified", (fields[4], fields[3]))
        elif rfields[0] == "cgroup":
            for opt in rfields[2].split(","):
                if opt in ("memory", "pids", "cpu"):
                    found.setdefault(opt, (fields[4], fields[3]))
    return found


def _own_cgroups() -> dict[str, str]:
    """controller (or "unified") -> this process's cgroup path, from /proc/self/cgroup."""
    own: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f.read().splitlines():
                _, controllers, path = line.split(":", 2)
                for c in controllers.split(",") if controllers else ["unified"]:
                    own[c] = path
    except (OSError, ValueError):
        pass
    return own


def _join(mount: tuple[str, str], path: str) -> str | None:
    point, root = mount
    if root != "/" and not path.startswith(root):
        return None
    rel = path[len(root) :] if root != "/" else path
    return os.path.join(point, rel.lstrip("/"))


def _parents() -> tuple[str | None, dict[str, str]]:
    """(cgroup v2 folder with memory+pids delegated, {v1 controller: folder}) this process may use."""
    mounts, own = _mounts(), _own_cgroups()
    v2 = os.environ.get("GRPOKIT_SANDBOX_CGROUP") or None
    if v2 is None and "unified" in mounts and "unified" in own:
        v2 = _join(mounts["unified"], own["unified"])
    if v2 is not None:
        try:
            with open(os.path.join(v2, "cgroup.subtree_control")) as f:
                if not {"memory", "pids"} <= set(f.read().split()):
                    v2 = None
        except OSError:
            v2 = None
    v1 = {
        c: p
        for c in ("memory", "pids", "cpu")
        if c in mounts and c in own and (p := _join(mounts[c], own[c])) is not None
    }
    return v2, v1


class Cgroup:
    """The cgroup(s) of one sandbox: created with its limits, joined by the launcher, killed, removed.

    Each folder is ``flock``ed by its creator from its ``mkdir`` to its removal. The kernel drops the
    lock when the creator dies, so the folders of a trainer killed mid-call (SIGKILL, the OOM killer, a
    reward worker ended at its timeout) are known to be orphans and swept (sandbox/cleanup.py), in any
    PID namespace. The random part of the name keeps a new folder clear of any such orphan: a pid
    alone is reused, and a leftover of that name stopped every later sandbox with "File exists".
    """

    def __init__(self, mechanism: str, folders: dict[str, str]):
        self.mechanism, self.folders = mechanism, folders  # controller ("unified" for v2) -> folder
        self._locks: list[int] = []  # descriptors holding each created folder's flock

    def _make(self, controller: str, parent: str, name: str) -> None:
        folder = os.path.join(parent, name)
        os.mkdir(folder)
        self.folders[controller] = folder
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._locks.append(fd)
        fcntl.flock(fd, fcntl.LOCK_EX)  # nobody else has a reason to hold it: a blocking call returns at once

    @classmethod
    def create(cls, p: Plan) -> "Cgroup":
        v2, v1 = _parents()
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        if p.mechanism == "cgroup2":
            cg = cls("cgroup2", {})
            try:
                cg._make("unified", v2 or "", name)
                cg._write("unified", "memory.max", p.memory_bytes)
                cg._write("unified", "memory.swap.max", 0, optional=True)
                cg._write("unified", "pids.max", p.tasks)
                cg._write("unified", "cpu.max", f"{int(p.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}", optional=True)
            except OSError:
                cg.remove()
                raise
            return cg
        cg = cls("cgroup1", {})
        try:
            for controller in ("memory", "pids", "cpu"):
                if controller in v1:
                    cg._make(controller, v1[controller], name)
            cg._write("memory", "memory.limit_in_bytes", p.memory_bytes)
            cg._write("memory", "memory.memsw.limit_in_bytes", p.memory_bytes, optional=True)  # no swap
            cg._write("pids", "pids.max", p.tasks)
            if "cpu" in cg.folders:
                cg._write("cpu", "cpu.cfs_period_us", CPU_PERIOD_US)
                cg._write("cpu", "cpu.cfs_quota_us", int(p.cpus * CPU_PERIOD_US))
        except OSError:
            cg.remove()
            raise
        return cg

    def _write(self, controller: str, file: str, value, optional: bool = False) -> None:
        try:
            with open(os.path.join(self.folders[controller], file), "w") as f:
                f.write(str(value))
        except (OSError, KeyError):
            if not optional:
                raise

    def procs_files(self) -> list[str]:
        """The cgroup.procs files the launcher writes "0" to (joining every controller) before exec."""
        return [os.path.join(folder, "cgroup.procs") for folder in self.folders.values()]

    def _tree(self) -> str:
        """The folder whose cgroup.procs lists the tree ("" when only a cpu folder is known)."""
        return self.folders.get("unified") or self.folders.get("pids") or self.folders.get("memory") or ""

    def _members(self) -> list[int]:
        try:
            with open(os.path.join(self._tree(), "cgroup.procs")) as f:
                return [int(x) for x in f.read().split()]
        except (OSError, ValueError, TypeError):
            return []

    def kill(self) -> None:
        """SIGKILL every process of the tree (cgroup.kill on v2; on v1, each member via a pidfd, until none)."""
        if "unified" in self.folders:
            try:
                with open(os.path.join(self.folders["unified"], "cgroup.kill"), "w") as f:
                    f.write("1")
                return
            except OSError:
                pass  # Linux < 5.14: no cgroup.kill
        for _ in range(100):  # pids.max bounds how many a fork bomb can refill between two rounds
            members = self._members()
            if not members:
                return
            for pid in members:
                _kill_member(pid, self._tree())

    def remove(self) -> None:
        """Remove the folders (the launcher reaped every member before exiting); retried while busy, and
        what is still inside after 20 tries (an orphan's leftovers) is killed."""
        for folder in self.folders.values():
            for attempt in range(100):
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if attempt == 20:
                        self.kill()
                    time.sleep(0.005)
        for fd in self._locks:  # after the rmdir: a sweep never sees one of ours unlocked
            os.close(fd)
        self._locks.clear()


def _kill_member(pid: int, folder: str) -> None:
    """SIGKILL `pid` through a pidfd, after checking it is still in the sandbox's cgroup (no pid reuse)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            if os.path.basename(folder) not in f.read():
                return
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def _usable(mech: str) -> bool:
    """Create, limit and remove a test cgroup: the host allows it only if all of that works."""
    try:
        Cgroup.create(Plan(mech, 8, 64 * 2**20, 64 * 2**20, 1.0)).remove()
        return True
    except OSError:
        return False


@lru_cache(maxsize=4)
def _mechanism(euid: int) -> str | None:
    v2, v1 = _parents()
    if v2 is not None and _usable("cgroup2"):
        return "cgroup2"
    if {"memory", "pids"} <= set(v1) and _usable("cgroup1"):
        return "cgroup1"
    return None


def mechanism() -> str | None:
    """ "cgroup2", "cgroup1" or None (rlimit fallback) for this process's uid on this host (cached)."""
    with _lock:
        return _mechanism(os.geteuid())
