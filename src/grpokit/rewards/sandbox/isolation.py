"""Running untrusted code: bubblewrap namespaces + an unprivileged uid + rlimits + a wall-clock kill.

How one run is isolated (Linux, bubblewrap installed):
- started from a tiny helper (`launcher.py`, `python -I -S`) via `subprocess`, not forked from the
  trainer; the helper joins the sandbox's cgroup (one budget for the whole tree: memory, tasks, CPU;
  see budget.py), sets rlimits (CPU seconds, address space, file size, open files, no core dumps) and
  execs `bwrap`;
- bwrap gives new PID, network (loopback only, down), IPC, UTS and cgroup namespaces, `--die-with-parent`
  and `--new-session`, and a private root: read-only /usr and the Python installation, a fresh /proc and
  /dev, a size-limited tmpfs /tmp as the only writable place, the job folder read-only at /work; nothing
  else of the host (no /home, /root, /etc, the dataset or the expected outputs) exists inside;
- the environment is emptied (`--clearenv`);
- as root, the program then drops to a fresh unprivileged uid/gid (setpriv, all capabilities and the
  bounding set dropped, no_new_privs) whose RLIMIT_NPROC counts only this sandbox; without root, bwrap's
  user namespace does the same job and `prlimit` sets RLIMIT_NPROC inside it (counted per namespace);
- the trusted parent kills the whole tree at the wall-clock limit, counted from when bwrap reports
  the sandbox started (its start-up, within ``START_BUDGET_S``, is not the program's time, nor the
  time of a deadline-bound call that runs the sandbox: ``grpokit.rewards.calls.startup``): through
  the cgroup when there is one, else SIGKILL to the namespace's init (pid from bwrap's --info-fd),
  and the kernel kills every process of that PID namespace; the launcher, a child subreaper, reaps
  bwrap and any orphan, so no zombie is left even when the trainer is PID 1;
- the parent waits on a pidfd (no polling) and parses the result channel with bounded line length
  and nesting: whatever the program writes, a malformed record only fails its case.

`probe()` checks at start-up that this actually works on the host (uid, pids, network, environment,
filesystem); code rewards refuse to run without it unless the user sets allow_unsafe_code_execution.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..calls import startup
from . import budget, cleanup, seccomp, uids

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run (each documented where it is enforced)."""

    wall_s: float = 2.0  # wall-clock kill of the whole process tree
    cpu_s: int = 2  # RLIMIT_CPU per process
    memory_bytes: int = 512 * 2**20  # memory of the whole tree (cgroup; rlimit mode: shared as RLIMIT_AS)
    processes: int = 32  # processes + threads of the whole tree (pids.max and RLIMIT_NPROC)
    cpus: float = 1.0  # CPUs the whole tree may use at once (cgroup CPU quota)
    budget: str = "auto"  # "auto": a cgroup where the host allows one, else rlimits; "rlimit": rlimits only
    file_bytes: int = 1 * 2**20  # RLIMIT_FSIZE: any file, including captured stdout/stderr
    tmp_bytes: int = 8 * 2**20  # size of the writable tmpfs /tmp
    open_files: int = 64
    max_output_bytes: int = 64 * 2**10  # how much of a case's stdout the parent looks at


@dataclass
class RunResult:
    """Raw result of a sandboxed run: `channel` lines from fd 3, exit status, whether it was killed."""

    channel: str
    returncode: int
    timed_out: bool
    stderr: str = ""
    records: list[dict] = field(default_factory=list)
    budget: str = ""  # how the budget was held: "cgroup2", "cgroup1" or "rlimit"
    channel_overflow: bool = False  # the channel held more than the parent reads (max_output_bytes * 64)


def _python_in_sandbox() -> tuple[list[str], str]:
    """Bind arguments for the base Python installation and its path inside the sandbox."""
    prefix = Path(sys.base_prefix).resolve()
    exe = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if str(prefix) == "/usr":
        return [], f"/usr/bin/{exe}"
    return ["--perms", "0755", "--dir", "/opt", "--ro-bind", str(prefix), "/opt/python"], f"/opt/python/bin/{exe}"


# new PID, network (loopback only, down), IPC, UTS and cgroup namespaces; bwrap's pid on descriptor 4
NAMESPACES = (
    "--unshare-pid --unshare-net --unshare-ipc --unshare-uts --unshare-cgroup-try --die-with-parent "
    "--new-session --info-fd 4 --hostname sandbox --clearenv"
).split()
DROP_PRIVILEGES = "--clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs".split()
SYSTEM_FILES = "--ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin".split()


def bwrap_argv(
    job_dir: str, limits: Limits, program: list[str], uid: int | None = None, tasks: int | None = None
) -> list[str]:
    """The bwrap command line; `program` runs inside with the job folder at /work and cwd /tmp.

    As root the program runs as `uid`; otherwise in a user namespace, where `tasks` (when given) becomes
    its RLIMIT_NPROC, set inside so that the kernel counts it per namespace, not on the trainer's uid."""
    bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
    py_bind, _ = _python_in_sandbox()
    argv = [
        bwrap,
        *NAMESPACES,
        *SYSTEM_FILES,
        *py_bind,
        *["--proc", "/proc", "--dev", "/dev"],
        *["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"],  # the only writable place
        *["--ro-bind", job_dir, "/work", "--chdir", "/tmp"],
    ]
    if seccomp.filter_bytes() is not None:
        argv += ["--seccomp", "5"]  # the launcher puts the filter on descriptor 5
    if os.geteuid() == 0:
        if uid is None:
            raise ValueError("As root a sandbox runs as a uid of its own: pass one from sandbox.uids.take().")
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]  # for setpriv alone, which drops them
        argv += ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", *DROP_PRIVILEGES]
    else:
        argv[1:1] = ["--unshare-user", "--uid", "65534", "--gid", "65534", "--disable-userns"]
        if tasks is not None:
            argv += ["/usr/bin/prlimit", f"--nproc={tasks}"]
    return argv + program


def run_sandboxed(
    files: dict[str, str],
    program: list[str],
    limits: Limits,
    isolated: bool = True,
    cancel: threading.Event | None = None,
) -> RunResult:
    """Write `files` into a fresh job folder and run `program` (argv; "{job}"/"{scratch}" are replaced).

    isolated=False runs with rlimits and an empty environment only (UNSAFE: no namespaces), and a
    cgroup budget where the host allows one. Raises budget.BudgetError when no budget can hold.
    Setting ``cancel`` ends the run as if its wall-clock limit had passed (a reward call's deadline).
    """
    plan = budget.plan(limits.memory_bytes, limits.processes, limits.cpus, limits.budget, isolated)
    root = os.geteuid() == 0
    uid = uids.take() if isolated and root else None
    cgroup = None
    try:
        try:
            cgroup = budget.Cgroup.create(plan) if plan.mechanism != "rlimit" else None
        except OSError as exc:
            raise budget.BudgetError(f"The sandbox's {plan.mechanism} budget could not be created: {exc}.") from exc
        return _run(files, program, limits, isolated, plan, uid, cgroup, cancel)
    finally:
        if cgroup is not None:
            cgroup.remove()
        uids.give_back(uid)


def _job_folder(tmp: str, files: dict[str, str]) -> str:
    """``tmp``/job holding ``files``, readable (not writable) by the sandbox's uid."""
    job = os.path.join(tmp, "job")
    os.mkdir(job)
    for name, text in files.items():
        Path(job, name).write_text(text)
        os.chmod(os.path.join(job, name), 0o644)
    os.chmod(job, 0o755)
    return job


def _command(
    program: list[str], tmp: str, job: str, limits: Limits, isolated: bool, plan: budget.Plan, uid: int | None
) -> list[str]:
    """`program` with "{job}", "{scratch}" and "{python}" replaced, inside bwrap when isolated."""
    if isolated:
        _, py = _python_in_sandbox()
        sub = {"{job}": "/work", "{scratch}": "/tmp", "{python}": py}
    else:
        scratch = os.path.join(tmp, "scratch")
        os.mkdir(scratch)
        sub = {"{job}": job, "{scratch}": scratch, "{python}": sys.executable}
    for key, value in sub.items():
        program = [a.replace(key, value) for a in program]
    if not isolated:
        return program
    return bwrap_argv(job, limits, program, uid, None if os.geteuid() == 0 else plan.tasks)


def _launcher_spec(
    argv: list[str], limits: Limits, isolated: bool, plan: budget.Plan, cgroup: budget.Cgroup | None
) -> dict:
    """launcher.py's request, less the descriptors: the command, its rlimits and the cgroups to join."""
    rlimits = {
        "cpu_s": limits.cpu_s,
        "memory_bytes": plan.process_memory_bytes,
        "file_bytes": limits.file_bytes,
        "open_files": limits.open_files,
    }
    if isolated and os.geteuid() == 0:  # the fresh uid's NPROC; never the trainer's uid (it would count its threads)
        rlimits["processes"] = plan.tasks
    procs = cgroup.procs_files() if cgroup is not None else []
    return {"parent_pid": os.getpid(), "argv": argv, "limits": rlimits, "cgroup_procs": procs}


def _run(
    files: dict[str, str],
    program: list[str],
    limits: Limits,
    isolated: bool,
    plan: budget.Plan,
    uid: int | None,
    cgroup: budget.Cgroup | None,
    cancel: threading.Event | None = None,
) -> RunResult:
    cleanup.sweep_when_due()  # what trainers killed mid-call left behind (sandbox/cleanup.py)
    with cleanup.job_folder() as tmp:
        job = _job_folder(tmp, files)
        argv = _command(program, tmp, job, limits, isolated, plan, uid)
        spec = _launcher_spec(argv, limits, isolated, plan, cgroup)
        bpf = seccomp.filter_bytes() if isolated else None
        Path(tmp, "seccomp").write_bytes(bpf or b"")
        with (
            open(os.path.join(tmp, "channel"), "w+b") as channel,
            open(os.path.join(tmp, "stderr"), "w+b") as err,
            open(os.path.join(tmp, "info"), "w+b") as info,
            open(os.path.join(tmp, "seccomp"), "rb") as flt,
        ):
            spec["channel_fd"] = channel.fileno()
            spec["info_fd"] = info.fileno() if isolated else None
            spec["seccomp_fd"] = flt.fileno() if bpf is not None else None
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(HERE / "launcher.py"), json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={},
                pass_fds=(channel.fileno(), info.fileno(), flt.fileno()),
                start_new_session=True,
            )
            timed_out = True
            try:
                if isolated:  # the launcher's and bwrap's start-up are not the program's wall time,
                    with startup():  # nor the time of the call that runs the sandbox (a python tool call)
                        _wait_begun(proc, info, cancel)
                timed_out = not wait_exit(proc, limits.wall_s, cancel)
            finally:  # also when the wait is interrupted (a reward's deadline): never leave the sandbox running
                _stop(proc, timed_out, cgroup, isolated, info)
            channel.seek(0)
            cap = limits.max_output_bytes * 64
            raw = channel.read(cap + 1)
            text = raw[:cap].decode("utf-8", "replace")
            err.seek(0)
            stderr = err.read(4096).decode("utf-8", "replace")
    return RunResult(
        text, proc.returncode, timed_out, stderr, parse_records(text), plan.mechanism, channel_overflow=len(raw) > cap
    )


START_BUDGET_S = 30.0  # the launcher and bwrap setting up the namespaces, on a loaded machine


def _wait_begun(proc: subprocess.Popen, info, cancel: threading.Event | None) -> None:
    """Wait until bwrap reports the sandbox's init started (its --info-fd JSON), the launcher exits,
    the call is cancelled or START_BUDGET_S passes: the program's wall clock starts then."""
    deadline = time.monotonic() + START_BUDGET_S
    while os.fstat(info.fileno()).st_size == 0 and proc.poll() is None and time.monotonic() < deadline:
        if cancel is not None and cancel.is_set():
            return
        time.sleep(0.002)


def _stop(proc: subprocess.Popen, timed_out: bool, cgroup: budget.Cgroup | None, isolated: bool, info) -> None:
    """Kill what is left of a sandboxed run (all of it when it timed out) and reap the launcher."""
    if timed_out and cgroup is not None:
        cgroup.kill()  # the whole tree, bwrap included
        wait_exit(proc, 2.0)
    elif timed_out and isolated:
        _kill_namespace(proc.pid, info)
        wait_exit(proc, 2.0)  # the launcher reaps bwrap and the namespace's init, then exits
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the launcher's process group
    except ProcessLookupError:
        pass
    if cgroup is not None:
        cgroup.kill()  # without namespaces (unsafe mode) a program's daemons left the process group
    proc.wait()


def wait_exit(proc: subprocess.Popen, timeout: float, cancel: threading.Event | None = None) -> bool:
    """Wait up to `timeout` seconds for `proc` to exit; True if it did. Sleeps on a pidfd (woken the
    moment the process exits) instead of Popen.wait(timeout)'s polling, which adds up to ~50 ms a call.
    With `cancel`, wakes every 0.1 s and gives up (False) once it is set."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3 or not Linux): poll
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while not poller.poll(max(0.0, min(deadline - time.monotonic(), 0.1 if cancel else 1e9)) * 1000):
            if time.monotonic() >= deadline or (cancel is not None and cancel.is_set()):
                return proc.poll() is not None
        return True
    finally:
        os.close(fd)


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _kill_namespace(launcher_pid: int, info) -> None:
    """SIGKILL the sandbox's PID-namespace init; the kernel then kills every process inside, bwrap
    exits once that init is reaped, and the launcher (a subreaper) reaps whatever is left."""
    info.seek(0)
    try:
        child = int(json.loads(info.read(4096) or b"{}").get("child-pid", 0))
        bwrap = _ppid(child)
        launcher = _ppid(bwrap) if bwrap > 1 else 0
    except (ValueError, OSError, AttributeError, TypeError, RecursionError):
        return
    if child > 1 and launcher_pid in (bwrap, launcher):  # never signal a recycled pid that is not ours
        os.kill(child, signal.SIGKILL)


MAX_LINE_BYTES = 1 * 2**20  # longest result line the parent parses; longer lines fail their case
MAX_DEPTH = 64  # deepest nesting of lists/dicts below a record (the harness sends at most 51)


def _depth(x) -> int:
    """Nesting depth of lists/dicts in a parsed JSON value, iteratively (no recursion to exhaust)."""
    deepest, stack = 0, [(x, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            if d + 1 > MAX_DEPTH + 1:
                return d + 1
            deepest = max(deepest, d + 1)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_records(text: str) -> list[dict]:
    """Result records from the channel. Anything malformed (too long, too deep, not JSON, an int too
    long to convert, no integer case number) is skipped, so its case fails; this never raises."""
    records = []
    for line in text.splitlines():
        if len(line) > MAX_LINE_BYTES:
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if type(record) is dict and type(record.get("case")) is int and _depth(record) <= MAX_DEPTH + 1:
            records.append(record)
    return records
