"""Job folders of trainers that died are swept; a live trainer's folder never is, in any PID namespace.

Before: a folder's owner counted as gone when its pid was not alive *here*. A trainer in another PID
namespace that shares the temp folder (a container, a cluster job) has pids that mean nothing here, so
the first sandboxed call of a neighbour removed that trainer's job folder while its program ran. Now a
folder's owner holds its ``flock`` for as long as it lives.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from grpokit.rewards.sandbox import cleanup

# Holds a job folder named for a pid that is alive nowhere (above any pid_max), until stdin closes.
HOLDER = r"""
import sys
from grpokit.rewards.sandbox import cleanup
cleanup.job_prefix = lambda: "grpokit-job-999999999-"
with cleanup.job_folder() as path:
    print(path, flush=True)
    sys.stdin.read()
"""

# As root, in a new PID namespace: the folder's owner is pid 4000000 there, a pid the host never has.
IN_NAMESPACE = r"""
import os, sys
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write("3999999")
pid = os.fork()
if pid == 0:
    from grpokit.rewards.sandbox import cleanup
    with cleanup.job_folder() as path:
        print(path, flush=True)
        sys.stdin.read()
    os._exit(0)
os.waitpid(pid, 0)
"""


def _env(tmp_path):
    return {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}


def _start(argv, tmp_path):
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(tmp_path))
    return proc, proc.stdout.readline().strip()


def test_a_held_folder_is_kept_and_swept_once_its_owner_is_killed(tmp_path):
    proc, path = _start([sys.executable, "-c", HOLDER], tmp_path)
    try:
        assert os.path.basename(path).startswith("grpokit-job-999999999-") and os.path.isdir(path)
        assert cleanup.sweep_stale_jobs(str(tmp_path)) == []  # its pid is alive nowhere, but it holds the lock
        assert os.path.isdir(path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert cleanup.sweep_stale_jobs(str(tmp_path)) == [path]
    assert os.listdir(tmp_path) == []


def test_a_trainer_in_another_pid_namespace_keeps_its_folder(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and util-linux unshare to start a trainer in a new PID namespace")
    argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", IN_NAMESPACE]
    proc, path = _start(argv, tmp_path)
    try:
        if not path:
            pytest.skip("this host refuses a new PID namespace")
        assert os.path.basename(path).startswith("grpokit-job-4000000-")
        assert cleanup.sweep_stale_jobs(str(tmp_path)) == []  # removed under the live trainer before
        assert os.path.isdir(path)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert not os.path.exists(path)  # its owner removed it on the way out


def test_job_folders_are_named_only_once_locked_and_leftover_staging_folders_go_when_old(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(cleanup.tempfile, "tempdir", None)  # re-read TMPDIR
    with cleanup.job_folder() as path:
        assert os.path.dirname(path) == str(tmp_path)
        assert os.path.basename(path).startswith(cleanup.job_prefix())
        assert os.listdir(tmp_path) == [os.path.basename(path)]  # the staging name is gone
        assert cleanup.sweep_stale_jobs(str(tmp_path)) == []  # our own, alive and held
    assert os.listdir(tmp_path) == []
    left = tmp_path / f"{cleanup.STAGING_PREFIX}x1"  # an owner killed between creating and naming it
    left.mkdir()
    assert cleanup.sweep_stale_jobs(str(tmp_path)) == []  # young: its owner may be naming it now
    old = time.time() - cleanup.STAGING_GRACE_S - 1
    os.utime(left, (old, old))
    assert cleanup.sweep_stale_jobs(str(tmp_path)) == [str(left)]
