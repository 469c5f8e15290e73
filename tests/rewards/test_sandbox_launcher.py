"""The launcher puts the trainer's descriptors on the numbers bwrap and the harness expect.

The trainer opens each run's channel, info and seccomp files in many threads at once, so they arrive on
any numbers, including each other's targets (3, 4, 5). A launcher that dup2'd them in a row overwrote one
with another: bwrap then read its seccomp filter from the result channel ("prctl(PR_SET_SECCOMP) reported
EINVAL") or wrote its pid into the channel, and an honest program scored 0 about once in 200 runs.
"""

import itertools
import json
import subprocess
import sys

import pytest

from grpokit.rewards.sandbox import isolation

# Runs in a fresh interpreter, where 3, 4 and 5 are free: it opens the three files on the numbers it is
# given, starts the launcher with a command that reports what it finds on 3, 4 and 5 and which other
# descriptors above 2 are open.
PARENT = r"""
import json, os, subprocess, sys, tempfile
numbers, launcher = json.loads(sys.argv[1]), sys.argv[2]
tmp = tempfile.mkdtemp()
fds = {}
for name, fd in zip(("channel", "info", "seccomp"), numbers):
    with open(os.path.join(tmp, name), "w") as f:
        f.write(name)
    got = os.open(os.path.join(tmp, name), os.O_RDONLY)
    if got != fd:
        os.dup2(got, fd)
        os.close(got)
    fds[name] = fd
report = (
    "import os, json\n"
    "seen = {fd: os.pread(fd, 20, 0).decode() for fd in (3, 4, 5)}\n"
    "others = [fd for fd in range(6, 2048) if fd != 0 and os.path.exists(f'/proc/self/fd/{fd}')]\n"
    "print(json.dumps([seen, others]))\n"
)
spec = {"parent_pid": os.getpid(), "argv": [sys.executable, "-c", report], "limits": {}, "cgroup_procs": [],
        "channel_fd": fds["channel"], "info_fd": fds["info"], "seccomp_fd": fds["seccomp"]}
out = subprocess.run([sys.executable, "-I", "-S", launcher, json.dumps(spec)], pass_fds=tuple(fds.values()),
                     capture_output=True, text=True, timeout=30)
print(out.stdout or out.stderr)
"""


@pytest.mark.parametrize("numbers", [list(p) for p in itertools.permutations([3, 4, 5])] + [[9, 4, 3], [5, 7, 8]])
def test_each_descriptor_lands_on_its_number_whatever_number_it_came_on(numbers):
    launcher = str(isolation.HERE / "launcher.py")
    out = subprocess.run(
        [sys.executable, "-c", PARENT, json.dumps(numbers), launcher], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    seen, others = json.loads(out.stdout)
    assert seen == {"3": "channel", "4": "info", "5": "seccomp"}, (numbers, out.stdout)
    assert others == [], f"descriptors of the trainer left open in the sandbox: {others}"
