"""The small helper that starts a sandbox: `python -I -S launcher.py '<json>'`.

It exists so that the sandbox is never `os.fork`ed from the large trainer process: the trainer starts
this tiny interpreter with `subprocess` (no preexec hook, so CPython can use vfork/exec). The helper
becomes a child subreaper, forks, and the child joins the sandbox's cgroups, sets the resource limits and
replaces itself (`execv`) with the sandbox command, which inherits them all (the helper itself stays out
of the cgroups, so a whole-tree kill leaves it alive to reap); the helper reaps that command and every orphan of the
sandbox, then exits with the command's status (128 + N when killed by signal N), so no zombie outlives
a call even when the trainer is PID 1.
Kept free of imports beyond the standard library and of any grpokit code.

It dies with the trainer: PR_SET_PDEATHSIG(SIGKILL), then a check that the trainer (``parent_pid``)
did not die before the request; bwrap's --die-with-parent and the PID namespace take the sandbox
along. In unsafe mode (no bwrap) the command gets the same parent-death signal (sandbox/cleanup.py).

JSON fields: parent_pid (the trainer's pid), argv (list[str], the command to exec), limits (dict name -> int, see
LIMITS), cgroup_procs (list of cgroup.procs files to join; if one cannot be joined the command is not started),
channel_fd (an inherited descriptor that becomes descriptor 3, the harness's result channel), info_fd (optional, becomes
descriptor 4 for bwrap's --info-fd), seccomp_fd (optional, becomes descriptor 5 for bwrap's
--seccomp).
"""

import json
import os
import resource
import sys

LIMITS = {
    "cpu_s": resource.RLIMIT_CPU,  # CPU seconds; SIGXCPU at the soft limit, SIGKILL one second later
    "memory_bytes": resource.RLIMIT_AS,  # address space per process (the tree's share without a cgroup)
    "processes": resource.RLIMIT_NPROC,  # processes + threads of the sandbox's fresh uid (root mode)
    "file_bytes": resource.RLIMIT_FSIZE,  # largest file (and stdout/stderr file) it may write
    "open_files": resource.RLIMIT_NOFILE,
}


def become_subreaper() -> None:
    """PR_SET_CHILD_SUBREAPER: orphans of the sandbox (bwrap's namespace init when bwrap's monitor
    exits first) are re-parented to this helper, which reaps them, instead of to the host's PID 1;
    a trainer that is itself PID 1 (a container without an init) would never reap them."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # 36 = PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def die_with_parent(parent_pid: int | None) -> None:
    """PR_SET_PDEATHSIG(SIGKILL); exit at once if the parent is already gone (it died before the call)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(137)


def place_descriptors(moves: dict[int, int]) -> None:
    """Put each inherited descriptor on its fixed number (target -> source), whatever numbers they came on.

    The trainer opens the files in many threads at once, so a source may already sit on another's target
    (channel on 4, info on 3): a plain dup2 in a row would overwrite one with the other, and bwrap would read
    its seccomp filter from the result channel (EINVAL) or write its pid into the channel. Every source is
    first copied above all targets, then onto its target; every other descriptor is closed."""
    import fcntl

    floor = max(moves) + 1
    high = {target: fcntl.fcntl(source, fcntl.F_DUPFD, floor) for target, source in moves.items()}
    for target, copy in high.items():
        os.dup2(copy, target)  # inheritable by default
    for fd in set(range(3, floor)) - set(moves):  # nothing else of the trainer reaches the sandbox
        os.closerange(fd, fd + 1)  # closerange ignores a descriptor that is not open
    os.closerange(floor, max([1024, *moves.values(), *high.values()]) + 1)


def start(spec: dict, launcher_pid: int) -> None:
    """In the forked child: join the cgroups, wire the descriptors, set the limits and exec the command."""
    for procs in spec.get("cgroup_procs", []):
        with open(procs, "w") as f:  # "0" = this process; what it starts is born inside
            f.write("0")
    moves = {3: spec["channel_fd"]}  # the harness's result channel
    if spec.get("info_fd") is not None:
        moves[4] = spec["info_fd"]  # bwrap --info-fd 4 writes the sandbox's pid there (closed inside)
    if spec.get("seccomp_fd") is not None:
        moves[5] = spec["seccomp_fd"]  # bwrap --seccomp 5 reads the BPF filter from there
    place_descriptors(moves)  # before RLIMIT_NOFILE, which may be below the numbers the copies need
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, value in spec["limits"].items():
        hard = value + 1 if name == "cpu_s" else value  # the extra second turns SIGXCPU into SIGKILL
        resource.setrlimit(LIMITS[name], (value, hard))
    die_with_parent(
        launcher_pid
    )  # the command (bwrap, or the program in unsafe mode) dies with this launcher; kept across execv
    os.execv(spec["argv"][0], spec["argv"])


def main() -> None:
    spec = json.loads(sys.argv[1])
    die_with_parent(spec.get("parent_pid"))
    become_subreaper()
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            start(spec, me)
        except BaseException as exc:  # never run the command outside its budget
            os.write(2, f"launcher: {type(exc).__name__}: {exc}\n".encode())
        finally:
            os._exit(127)
    inherited = [spec[k] for k in ("channel_fd", "info_fd", "seccomp_fd") if spec.get(k) is not None]
    os.closerange(3, max([1024, *inherited]) + 1)  # the channel stays open in the sandbox only
    status = 0
    while True:  # reap the sandbox command and every orphan re-parented here, until none is left
        try:
            reaped, st = os.wait()
        except ChildProcessError:
            break
        if reaped == pid:
            status = os.waitstatus_to_exitcode(st)
    os._exit(status if status >= 0 else 128 - status)  # killed by signal N -> 128 + N, like a shell


if __name__ == "__main__":
    main()
