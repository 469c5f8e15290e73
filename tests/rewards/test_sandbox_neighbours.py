"""Honest programs are never penalised by the trainer's own threads or by a hostile neighbour.

Without root, an RLIMIT_NPROC set before bwrap would count every process and thread of the trainer's
uid: a trainer with 40 threads would make honest programs score 0 ("Creating new namespace failed:
Resource temporarily unavailable"), and a fork bomb in one sandbox its neighbours in the same batch.
So the limit is set inside each sandbox's user namespace (counted per namespace since Linux 5.14) or
held by a cgroup per sandbox. The non-root tests run the trainer side as a real unprivileged
uid (1000), which needs root to set up; they are skipped elsewhere.
"""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from grpokit.rewards.code import code_pass_fraction, probe
from helpers.paths import ROOT

ok, why = probe()
pytestmark = pytest.mark.skipif(not ok, reason=f"sandbox isolation unavailable on this host: {why}")
SRC = str(ROOT / "src")

HONEST = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
FORK_BOMB = "```python\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n```"
MEMORY_HOG = (
    "```python\nimport os, time\nfor _ in range(6):\n    if os.fork() == 0:\n"
    "        x = bytearray(400 * 2**20)\n        time.sleep(30)\ntime.sleep(30)\n```"
)
THREAD_BOMB = (
    "```python\nimport threading, time\nwhile True:\n    try:\n"
    "        threading.Thread(target=time.sleep, args=(30,)).start()\n    except RuntimeError:\n"
    "        while True:\n            pass\n```"
)
CASES = [{"input": "1 2\n", "output": "3\n"}]

BUSY_TRAINER = r"""
import os, sys, threading, time
from grpokit.rewards.code import code_pass_fraction, probe
assert os.geteuid() == int(sys.argv[1]) and probe()[0], probe()
stop = threading.Event()
threads = [threading.Thread(target=lambda: [time.sleep(0.01) for _ in iter(stop.is_set, True)]) for _ in range(40)]
for t in threads:
    t.start()
try:
    print(code_pass_fraction([HONEST] * 4, [CASES] * 4, wall_s=5.0, max_parallel=4))
finally:
    stop.set()
"""

MIXED_BATCH = r"""
import os, sys
from grpokit.rewards.code import code_pass_fraction, probe
assert os.geteuid() == int(sys.argv[1]) and probe()[0], probe()
print(code_pass_fraction([FORK_BOMB, HONEST, MEMORY_HOG, HONEST, THREAD_BOMB, HONEST], [CASES] * 6,
                         wall_s=5.0, max_parallel=6))
"""


def _script(body: str) -> str:
    consts = (
        f"HONEST, FORK_BOMB, MEMORY_HOG, THREAD_BOMB, CASES = {HONEST!r}, {FORK_BOMB!r}, {MEMORY_HOG!r}, "
        f"{THREAD_BOMB!r}, {CASES!r}\n"
    )
    return consts + body


def _untraversable(path: str) -> str | None:
    """The first ancestor of `path` that other users cannot enter (e.g. a 0700 /root), or None."""
    parts = Path(path).resolve().parts
    for i in range(2, len(parts) + 1):
        folder = os.path.join(*parts[:i])
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


PID1_TRAINER = r"""
import os, sys
from grpokit.rewards.code import code_pass_fraction
assert os.getpid() == 1 and os.geteuid() == int(sys.argv[1])
looping = "```python\nimport os\nos.fork()\nwhile True:\n    pass\n```"  # killed at the wall-clock limit
# 3 s: an honest program beside five CPU-bound loops must not miss its limit on a loaded machine
scores = code_pass_fraction([HONEST] * 20 + [looping] * 10, [CASES] * 30, wall_s=3.0, max_parallel=5)
zombies = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        zombies += open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        pass
print([float(zombies), float(scores.count(1.0)), float(scores.count(0.0))])
"""


def run_as_uid_1000(body: str, pid1: bool = False) -> list[float]:
    """Run `body` as a real unprivileged uid 1000 (not root in a user namespace: the kernel must charge
    its processes to uid 1000). A Python installed below a folder only root may enter (pyenv in /root)
    is made reachable inside a private mount namespace: a tmpfs over that folder with the installation
    bound back in; the host's mounts are untouched."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("needs root, unshare and setpriv to start a trainer as an unprivileged uid")
    prefix = str(Path(sys.base_prefix).resolve())
    for needed in (sys.prefix, SRC):
        if _untraversable(needed):
            pytest.skip(f"{needed} is not reachable by an unprivileged uid")
    hidden = _untraversable(prefix)
    setup, keep = "", f"/tmp/grpokit-prefix-{os.getpid()}"
    if hidden is not None:
        setup = (
            f"mkdir -p {keep} && mount --bind {prefix} {keep} && mount -t tmpfs -o mode=755 none {hidden} && "
            f"mkdir -p {prefix} && mount --bind {keep} {prefix} && "
        )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": SRC, "HOME": "/tmp"}
    pid_ns = "unshare --pid --fork --mount-proc " if pid1 else ""  # the trainer becomes PID 1
    cmd = setup + f'exec {pid_ns}setpriv --reuid=1000 --regid=1000 --clear-groups "$0" -c "$1" 1000'
    try:
        out = subprocess.run(
            ["unshare", "--mount", "sh", "-c", cmd, sys.executable, _script(body)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            cwd="/tmp",
        )
    finally:
        if os.path.isdir(keep):
            os.rmdir(keep)  # an empty mount point on the host; the bind mount died with the namespace
    if out.returncode != 0 and "unshare failed" in out.stderr:
        pytest.skip(f"this host refuses a mount or PID namespace: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr[-2000:]
    return eval(out.stdout.strip().splitlines()[-1])  # a printed list of floats


def test_forty_busy_trainer_threads_do_not_fail_honest_programs_without_root():
    # With the trainer's 40 threads counted against the sandbox's process limit of 32 this would be
    # [0.0, 0.0, 0.0, 0.0] (bwrap: "Creating new namespace failed: Resource temporarily unavailable").
    assert run_as_uid_1000(BUSY_TRAINER) == [1.0] * 4


def test_hostile_neighbours_do_not_fail_honest_programs_without_root():
    # A fork bomb, a memory hog (6 children x 400 MB) and a thread bomb that then spins, beside three
    # honest programs, six sandboxes at once. Were the fork bomb's processes counted against the
    # trainer's uid, its honest neighbours would score 0 as well.
    assert run_as_uid_1000(MIXED_BATCH) == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]


def test_hostile_neighbours_do_not_fail_honest_programs_as_root():
    # The same batch in this process (as root: a cgroup per sandbox where the host allows one, else
    # a fresh uid per sandbox whose RLIMIT_NPROC counts only that sandbox).
    if os.geteuid() != 0:
        pytest.skip("the non-root variant is the test above; this one checks the root path")
    scores = code_pass_fraction(
        [FORK_BOMB, HONEST, MEMORY_HOG, HONEST, THREAD_BOMB, HONEST], [CASES] * 6, wall_s=5.0, max_parallel=6
    )
    assert scores == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]


def test_no_zombies_and_no_lost_calls_when_a_non_root_trainer_is_pid_1():
    # As PID 1 without root, a launcher without a subreaper leaves a zombie per call, and the zombies count
    # against the process limit charged to the trainer's uid (it printed [20 zombies, 12 passed, 18 failed]).
    # Expected: 0 zombies, the 20 honest programs pass and the 10 loops fail. The probe must not signal the
    # trainer's pid (1 here: that would reach bwrap's init inside the sandbox and refuse the trainer).
    assert run_as_uid_1000(PID1_TRAINER, pid1=True) == [0.0, 20.0, 10.0]
