"""Job folders and sandbox cgroups of trainers that died are swept; a live trainer's never are, in any
PID namespace.

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

from grpokit.rewards.sandbox import budget, cleanup

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


# Creates a sandbox cgroup with the host's mechanism and holds it (and its flock), until stdin closes.
CGROUP_HOLDER = r"""
import sys
from grpokit.rewards.sandbox import budget
cg = budget.Cgroup.create(budget.Plan(budget.mechanism(), 8, 64 << 20, 64 << 20, 1.0))
print(" ".join(cg.folders.values()), flush=True)
sys.stdin.read()
cg.remove()
"""


def _need_cgroup():
    if budget.mechanism() is None:
        pytest.skip("no writable cgroup on this host: sandboxes hold their budget with rlimits, and leave no folder")


def test_a_held_cgroup_is_kept_and_swept_with_its_leftover_process_once_its_creator_is_killed(tmp_path, monkeypatch):
    # Before: nothing removed the cgroups of a trainer killed mid-call; 124 gathered on one host, and a
    # later process given the same pid stopped at "File exists" creating a name it had used
    _need_cgroup()
    monkeypatch.setattr(cleanup, "CGROUP_GRACE_S", 0.0)
    proc, line = _start([sys.executable, "-c", CGROUP_HOLDER], tmp_path)
    folders = line.split()
    left = subprocess.Popen(["sleep", "300"])  # a process the killed trainer's sandbox left running
    try:
        assert folders and all(os.path.basename(f).startswith(f"grpokit-sandbox-{proc.pid}-") for f in folders)
        for folder in folders:
            with open(os.path.join(folder, "cgroup.procs"), "w") as f:
                f.write(str(left.pid))
        assert not set(folders) & set(cleanup.sweep_stale_cgroups())  # held: kept, with what runs in it
        assert all(os.path.isdir(f) for f in folders) and left.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert set(folders) <= set(cleanup.sweep_stale_cgroups())
        assert not any(os.path.exists(f) for f in folders)
        assert left.wait(timeout=10) == -signal.SIGKILL
    finally:
        for p in (proc, left):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_young_cgroup_is_never_swept_and_a_released_one_is_gone(tmp_path, monkeypatch):
    _need_cgroup()
    proc, line = _start([sys.executable, "-c", CGROUP_HOLDER], tmp_path)
    folders = line.split()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not set(folders) & set(cleanup.sweep_stale_cgroups())  # unlocked, but younger than the grace
    monkeypatch.setattr(cleanup, "CGROUP_GRACE_S", 0.0)
    assert set(folders) <= set(cleanup.sweep_stale_cgroups())
    proc, line = _start([sys.executable, "-c", CGROUP_HOLDER], tmp_path)
    folders = line.split()
    proc.stdin.close()  # its owner removes it on the way out
    assert proc.wait(timeout=30) == 0
    assert not any(os.path.exists(f) for f in folders)


def test_sandbox_cgroup_names_are_never_reused_by_a_process_of_the_same_pid():
    # the name is the pid (for people) and 64 random bits: a leftover of a dead process of the same pid
    # can no longer be the name a new sandbox asks for
    _need_cgroup()
    plan = budget.Plan(budget.mechanism(), 8, 64 << 20, 64 << 20, 1.0)
    made = [budget.Cgroup.create(plan) for _ in range(3)]
    try:
        names = {os.path.basename(f) for cg in made for f in cg.folders.values()}
        assert len(names) == 3 and all(n.startswith(f"grpokit-sandbox-{os.getpid()}-") for n in names)
        assert all(len(n.rsplit("-", 1)[1]) == 16 for n in names)
    finally:
        for cg in made:
            cg.remove()
    assert not any(os.path.exists(f) for cg in made for f in cg.folders.values())


def test_sweeps_run_at_the_first_sandboxed_call_and_again_once_due(monkeypatch):
    # a trainer restarted within seconds of a kill (a cluster's requeue) finds the dead one's cgroups still
    # inside their grace at its first call: a run that sweeps only once would keep them for its whole life
    calls = []
    monkeypatch.setattr(cleanup, "sweep_stale_jobs", lambda: calls.append("jobs"))
    monkeypatch.setattr(cleanup, "sweep_stale_cgroups", lambda: calls.append("cgroups"))
    monkeypatch.setattr(cleanup.uids, "sweep_stale", lambda: calls.append("uids"))
    now = [1000.0]
    monkeypatch.setattr(cleanup, "_clock", lambda: now[0])  # only the sweep's clock: no other thread's
    monkeypatch.setattr(cleanup, "_next_sweep", [0.0])
    cleanup.sweep_when_due()
    every = ["jobs", "cgroups"] + (["uids"] if os.geteuid() == 0 else [])
    assert calls == every
    now[0] += cleanup.SWEEP_EVERY_S - 1
    cleanup.sweep_when_due()
    assert calls == every  # not due yet
    now[0] += 1
    cleanup.sweep_when_due()
    assert calls == every * 2
