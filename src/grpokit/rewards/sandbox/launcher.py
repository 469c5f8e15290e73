"""The small helper that starts a sandbox: `python -I -S launcher.py '<json>'`.

It exists so that the sandbox is never `os.fork`ed from the large trainer process: the trainer starts
this tiny interpreter with `subprocess` (no preexec hook, so CPython can use vfork/exec), the helper sets
resource limits on itself and replaces itself (`execv`) with the sandbox command, which inherits them.
Kept free of imports beyond the standard library and of any grpokit code.

JSON fields: argv (list[str], the command to exec), limits (dict name -> int, see LIMITS), channel_fd
(an inherited descriptor that becomes descriptor 3, the harness's result channel), info_fd (optional,
becomes descriptor 4 for bwrap's --info-fd).
"""
import json
import os
import resource
import sys

LIMITS = {
    "cpu_s": resource.RLIMIT_CPU,  # CPU seconds; SIGXCPU at the soft limit, SIGKILL one second later
    "memory_bytes": resource.RLIMIT_AS,  # address space per process
    "processes": resource.RLIMIT_NPROC,  # processes + threads of the sandbox uid
    "file_bytes": resource.RLIMIT_FSIZE,  # largest file (and stdout/stderr file) it may write
    "open_files": resource.RLIMIT_NOFILE,
}


def main() -> None:
    spec = json.loads(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, value in spec["limits"].items():
        hard = value + 1 if name == "cpu_s" else value  # the extra second turns SIGXCPU into SIGKILL
        resource.setrlimit(LIMITS[name], (value, hard))
    os.dup2(spec["channel_fd"], 3)  # inheritable by default
    if spec.get("info_fd") is not None:
        os.dup2(spec["info_fd"], 4)  # bwrap --info-fd 4 writes the sandbox's pid there (closed inside)
    os.closerange(5 if spec.get("info_fd") is not None else 4, 1024)  # nothing else of the trainer reaches the sandbox
    os.execv(spec["argv"][0], spec["argv"])


if __name__ == "__main__":
    main()
