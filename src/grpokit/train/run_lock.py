"""One writer per run folder: ``RUN_DIR/run.lock`` names the process that trains in it.

Two processes writing one run folder (a second ``grpokit train --resume RUN_DIR`` or ``--out RUN_DIR
--overwrite`` while the first still trains) would interleave their metrics and overwrite each
other's checkpoints. A run takes the lock before it touches the folder and gives it back when
``train()`` ends; a second writer is refused with one sentence naming the holder.

How a holder is known to be alive:

* **The kernel's lock.** The holder keeps ``flock`` on the file. The kernel drops it when the process
  dies, however it dies (``kill -9`` included), so on one machine a lock left by a dead process is
  simply taken over. The file also names the holder (pid, host, boot id, PID namespace, the
  process's start time, its command line) for the refusal and for the rules below.
* **The same machine** (same host name, boot id and PID namespace) without a working ``flock`` (some
  network or FUSE filesystems): the named pid must exist with the recorded start time; a pid that
  is gone, or reused by another process, is stale.
* **Another host** (or this one before a restart: another boot id) on a shared filesystem, where ``flock``
  may not reach across hosts (Lustre's ``localflock``) or the server keeps a dead client's lock for its
  lease (NFSv4, about 90 s): the holder touches the file every ``HEARTBEAT_S`` (10 s) from a background thread.
  Another host's lock is watched, timed by this process's own clock (record/run_writer.Heartbeat, the rule
  ``report --watch`` judges a run by too): if its time moves, the holder is
  alive and the start is refused; if it does not, it is taken over. Its time, compared with the
  filesystem's (a probe file written beside it), only sets how long to watch: what is left of
  ``STALE_S`` (60 s) for a fresh heartbeat, ``STALE_S`` for one from the future (its host's clock is
  ahead), a heartbeat interval and a half for one older than ``STALE_S`` (in case its host's clock is
  behind). A job restarted on another node right after its old node died thus waits at most ``STALE_S``
  seconds, whatever the clocks say.

The file's record (``Holder``) and the probes of a holder's life (its pid and start time) are
record/run_writer.py's, where the readers of a run folder (the doctor, the report) use them too.

A holder that finds the file no longer names it (a process elsewhere judged it stale, e.g. a frozen
VM that came back) stops at the end of its step with one sentence, writing nothing more. Within one
process the lock is shared: a second ``Trainer`` on the same folder in the same process proceeds.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import ClassVar

from grpokit.config.sections import ConfigError
from grpokit.record.run_writer import (
    HEARTBEAT_S,
    LOCK_FILE,
    STALE_S,
    Heartbeat,
    Holder,
    alive_here,
    holder_of,
    this_process,
)

NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class RunLock:
    """The lock of one run folder, held by this process (``release`` when the run ends)."""

    _held: ClassVar[dict[str, RunLock]] = {}  # this process's locks, by folder: a second Trainer shares one
    _guard = threading.Lock()

    def __init__(self, path: Path, fd: int, me: Holder, made_dir: bool):
        self.path, self._fd, self.me, self._made_dir = path, fd, me, made_dir
        self.users, self.lost_to = 1, None
        self._ino = os.fstat(fd).st_ino
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="grpokit-run-lock", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            holder = holder_of(self.path)
            if holder is not None and holder != self.me:
                self.lost_to = holder
                return
            try:
                os.utime(self._fd)
            except OSError:
                pass

    def check(self) -> None:
        """Raise ConfigError when another process has taken the folder over (this one must write no more).
        Read here too, not only by the heartbeat: a process frozen for a while may finish a step before its
        heartbeat thread runs again."""
        holder = holder_of(self.path) if self.lost_to is None else None
        if holder is not None and holder != self.me:
            self.lost_to = holder
        if self.lost_to is not None:
            raise ConfigError(
                f"run folder {str(self.path.parent)!r} was taken over by {self.lost_to.describe()} (this "
                f"process's heartbeat in {LOCK_FILE} was judged stale); this process stops without writing more"
            )

    def release(self) -> None:
        with RunLock._guard:
            self.users -= 1
            if self.users > 0 or self._fd < 0:
                return
            RunLock._held.pop(str(self.path), None)
            self._stop.set()
            try:
                if self.lost_to is None and os.stat(self.path).st_ino == self._ino:
                    self.path.unlink()
            except OSError:
                pass
            os.close(self._fd)
            self._fd = -1
            if self._made_dir:
                try:
                    self.path.parent.rmdir()  # a run that failed before writing anything leaves no empty folder
                except OSError:
                    pass


class NullLock:
    """In a multi-process run the ranks other than 0 hold nothing (rank 0 holds the folder's lock)."""

    lost_to = None  # RunLock's: this rank never held the folder, so it was never taken from it

    def check(self) -> None:
        pass

    def release(self) -> None:
        pass


def acquire(run_dir: Path, log=print) -> RunLock | NullLock:
    """Take ``run_dir``'s lock (creating the folder), or raise ConfigError naming the live holder."""
    from grpokit.train.distributed import position

    if position()[0] != 0:  # torchrun's RANK, or a process group joined before the trainer was built
        return NullLock()
    made_dir = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = (run_dir / LOCK_FILE).resolve()
    with RunLock._guard:
        held = RunLock._held.get(str(path))
        if held is not None:
            held.users += 1
            return held
    me = this_process()
    for _ in range(5):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            kernel = _flock(fd)
            if _replaced(fd, path):  # another process removed or replaced the file meanwhile: try again
                os.close(fd)
                continue
            holder = holder_of(path)
            stale = _judge(run_dir, path, fd, holder, me, kernel, log)
            if stale == "replace":
                _replace(fd, path)
                os.close(fd)
                continue
            _write(fd, me)
            if kernel is None and not _still_mine(path, me):  # no flock: the last of two racing writers wins
                os.close(fd)
                raise _refusal(run_dir, holder_of(path))
        except BaseException:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
            raise
        lock = RunLock(path, fd, me, made_dir)
        with RunLock._guard:
            RunLock._held[str(path)] = lock
        return lock
    raise ConfigError(
        f"the lock {str(path)!r} kept changing while this process tried to take it; another process is "
        "starting in the same run folder, so run again once it has started or ended"
    )


def _flock(fd: int) -> bool | None:
    """True: this process now holds the kernel's lock; False: a live process holds it; None: no flock here."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in NO_FLOCK:
            return None
        raise


def _replaced(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino != os.fstat(fd).st_ino
    except FileNotFoundError:
        return True


def _judge(run_dir: Path, path: Path, fd: int, holder: Holder | None, me: Holder, kernel: bool | None, log) -> str:
    """ "take" (free or stale: this process may write its name in), "replace" (stale but still locked by
    the kernel elsewhere: a new file), or raise the refusal."""
    if holder is None:  # empty or half-written: free if the kernel says so, else a holder still starting
        if kernel or (kernel is None and _age(run_dir, path) > STALE_S):
            return "take"
        raise _refusal(run_dir, None)
    if holder.boot_id and holder.boot_id == me.boot_id and kernel is not None:  # one kernel: its lock is the truth
        if kernel is False or (holder.same_machine(me) and holder.pid != me.pid and alive_here(holder)):
            raise _refusal(run_dir, holder)  # (the second test: a lock file replaced under a live holder)
        log(f"grpokit: taking over {path} from {holder.describe()}, which is no longer running", flush=True)
        return "take"
    if holder.same_machine(me):  # no flock on this filesystem: the pid and its start time decide
        if holder.pid != me.pid and alive_here(holder):
            raise _refusal(run_dir, holder)
        log(f"grpokit: taking over {path} from {holder.describe()}, which is no longer running", flush=True)
        return "take"
    why = _watch(run_dir, path, log, holder)
    if why is None:
        raise _refusal(run_dir, holder)
    log(f"grpokit: taking over {path} from {holder.describe()}, {why}", flush=True)
    return "take" if kernel is not False else "replace"


def _watch(run_dir: Path, path: Path, log, holder: Holder) -> str | None:
    """Another host's lock: why it is stale (a phrase), or None when its heartbeat moved (alive).
    The verdict is this process's own observation, timed by its own monotonic clock: the lock's time
    only says how long to watch, so hosts whose clocks disagree cannot stall a start or judge a live
    holder dead. A heartbeat from the future (its host's clock ahead) is watched ``STALE_S`` at most;
    one older than ``STALE_S`` for a heartbeat interval and a half, in case its host's clock is behind."""
    age = _age(run_dir, path)
    beat = Heartbeat(path)
    beat.moved()  # the first look
    if age > STALE_S:
        window = min(STALE_S, 1.5 * HEARTBEAT_S)
        why = f"whose heartbeat stopped {age:.0f} s ago"
    elif age < -1.0:  # (a second's grace: filesystems round times)
        window = STALE_S
        why = f"whose heartbeat did not move for {window:.0f} s (its time is {-age:.0f} s ahead of this filesystem's)"
        log(
            f"grpokit: {path} names {holder.describe()}, on another host, with a heartbeat {-age:.0f} s in the "
            f"future (the hosts' clocks disagree); waiting up to {window:.0f} s to see whether it is alive",
            flush=True,
        )
    else:
        window = STALE_S - max(0.0, age)
        why = f"whose heartbeat stopped {STALE_S:.0f} s ago"
        log(
            f"grpokit: {path} names {holder.describe()}, on another host, with a heartbeat {max(0.0, age):.0f} s "
            f"old; waiting up to {window:.0f} s to see whether it is alive",
            flush=True,
        )
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        time.sleep(max(0.0, min(1.0, STALE_S / 10, deadline - time.monotonic())))
        if beat.moved():
            return None
    return why


def _age(run_dir: Path, path: Path) -> float:
    """Seconds since the lock was last touched, by the filesystem's own clock (a probe file's time)."""
    probe = run_dir / f".{LOCK_FILE}.probe-{socket.gethostname()}-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        return probe.stat().st_mtime - path.stat().st_mtime
    finally:
        probe.unlink(missing_ok=True)


def _replace(fd: int, path: Path) -> None:
    """Move a stale lock still locked elsewhere out of the way; put it back if it was not the one judged."""
    tomb = path.with_name(f".{LOCK_FILE}.stale-{socket.gethostname()}-{os.getpid()}")
    try:
        os.rename(path, tomb)
    except FileNotFoundError:
        return
    if os.stat(tomb).st_ino != os.fstat(fd).st_ino:  # someone else's new lock: give it back
        try:
            os.link(tomb, path)
        except FileExistsError:
            pass
    tomb.unlink(missing_ok=True)


def _write(fd: int, me: Holder) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(asdict(me)) + "\n").encode(), 0)
    os.fsync(fd)


def _still_mine(path: Path, me: Holder) -> bool:
    time.sleep(0.5)
    return holder_of(path) == me


def _refusal(run_dir: Path, holder: Holder | None) -> ConfigError:
    who = holder.describe() if holder is not None else "a process that is still starting"
    return ConfigError(
        f"run folder {str(run_dir)!r} is in use by another grpokit process ({who}); a second writer would "
        f"mix both runs' records and checkpoints, so wait for it to end or stop it, then run this again"
    )
