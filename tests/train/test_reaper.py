"""Nothing a reward starts outlives the run (train/reaper.py, rewards/process_tree.py).

A reward starts, on its first call, a plain child, a child in a new session (setsid) and a daemon
(double fork + setsid: its grandchild is orphaned at once), each sleeping for 10 minutes and writing
its pid. Before the reaper, all three were left alive under pid 1 after a run that exited 0. Checked
with the reward in the trainer's process and in a worker process, in a run that ends normally, and in
real `grpokit train` processes stopped by SIGTERM and by a reward failing on the whole batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpokit.train import Trainer
from helpers.runs import ROWS, tiny_cfg
from helpers.train_processes import finish, start, wait_for, write_setup

SPAWN = r"""
import os, subprocess, sys
from pathlib import Path

SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
DAEMON = (
    "import os, sys, time\n"
    "if os.fork(): os._exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): os._exit(0)\n"
    "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)\n"
)


def leave_processes(folder):
    folder = Path(folder)
    if (folder / "started").exists():
        return
    (folder / "started").write_text("")
    subprocess.Popen([sys.executable, "-c", SLEEPER, str(folder / "plain.pid")])
    subprocess.Popen([sys.executable, "-c", SLEEPER, str(folder / "setsid.pid")], start_new_session=True)
    subprocess.run([sys.executable, "-c", DAEMON, str(folder / "daemon.pid")], check=True)
    import time
    names = ("plain.pid", "setsid.pid", "daemon.pid")
    while not all((folder / n).exists() and (folder / n).read_text() for n in names):
        time.sleep(0.02)  # all three running before the call returns
"""
exec(SPAWN)  # noqa: S102 - the same code as the subprocess runs' reward module, defined here for pickling
PIDS = ("plain.pid", "setsid.pid", "daemon.pid")


def leaves_processes(completions, **kwargs):
    leave_processes(os.environ["GRPOKIT_TEST_PID_DIR"])  # noqa: F821 - defined by exec above
    return [0.0] * len(completions)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _pids(folder: Path, timeout: float = 30) -> list[int]:
    deadline = time.time() + timeout
    while not all((folder / p).exists() and (folder / p).read_text() for p in PIDS):
        assert time.time() < deadline, "the reward's processes did not start"
        time.sleep(0.05)
    return [int((folder / p).read_text()) for p in PIDS]


def _all_gone(pids: list[int], timeout: float = 10) -> list[int]:
    deadline = time.time() + timeout
    while any(map(_alive, pids)) and time.time() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_finished_run_ends_what_its_reward_started(tiny_model_dir, tmp_path, monkeypatch, workers):
    monkeypatch.setenv("GRPOKIT_TEST_PID_DIR", str(tmp_path))
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # not the run's
    try:
        cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{"train.steps": 1, "reward.num_workers": workers})
        cfg.data.dataset = ""
        Trainer(cfg, reward_funcs=[leaves_processes], train_rows=ROWS, quiet=True).train()
        pids = _pids(tmp_path, timeout=1)
        assert _all_gone(pids) == []
        assert before.poll() is None  # a process started before the run is not the run's to end
    finally:
        before.kill()
        before.wait()


REWARD = (
    SPAWN
    + """

def reward(completions, **kwargs):
    leave_processes(os.environ["GRPOKIT_TEST_PID_DIR"])
    if os.environ.get("FAIL") == "1":
        raise ValueError("this reward fails on every completion")
    if os.environ.get("HANG") == "1":
        import time
        time.sleep(600)
    return [0.0] * len(completions)
"""
)


@pytest.mark.parametrize("how", ["sigterm", "error"])
def test_a_grpokit_train_stopped_by_a_signal_or_an_error_leaves_no_process(tiny_model_dir, tmp_path, how):
    cfg = write_setup(tmp_path, tiny_model_dir, stop_grace_s=1)
    (tmp_path / "myrewards.py").write_text(REWARD)
    cfg.write_text(cfg.read_text().replace("myrewards:likes_a", "myrewards:reward"))
    env = {"GRPOKIT_TEST_PID_DIR": str(tmp_path), "FAIL": str(int(how == "error")), "HANG": str(int(how == "sigterm"))}
    proc = start(["--config", str(cfg), "--out", str(tmp_path / "run")], tmp_path, env=env)
    if how == "sigterm":  # the reward hangs once its processes run: stop the run then
        wait_for(lambda: all((tmp_path / p).exists() and (tmp_path / p).read_text() for p in PIDS), proc)
        proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc, timeout=120)
    pids = _pids(tmp_path, timeout=1)
    assert code == (143 if how == "sigterm" else 2), err[-2000:]
    assert _all_gone(pids) == [], "processes the reward started outlived the run"
