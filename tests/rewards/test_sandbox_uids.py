"""Root's sandboxes each run as a uid no other running sandbox of the host has, in any process.

Before: the uid was ``random.randrange`` from Python's global generator, which the trainer seeds alike
on every rank, so two ranks on one node drew the same uids in the same order (and each draw moved the
random state that checkpoints save). A fork bomb in one rank's sandbox then used up the process limit
of an honest program in the other's.
"""

import os
import random
import signal
import subprocess
import sys
import warnings

import pytest

from grpokit.rewards.sandbox import uids
from grpokit.rewards.sandbox.budget import BudgetError

# A trainer-like process: seeds Python's random as the trainer does, takes N uids, prints them, holds
# them until its standard input closes (or it is killed).
HOLDER = r"""
import random, sys
from grpokit.rewards.sandbox import uids
folder, first, count, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
uids.FOLDER, uids.FIRST, uids.COUNT = folder, first, count
random.seed(0)
print(*[uids.take() for _ in range(n)], flush=True)
sys.stdin.read()
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    path = tmp_path / "uids"
    monkeypatch.setattr(uids, "FOLDER", str(path))
    return path


def hold(folder, n, first=uids.FIRST, count=uids.COUNT):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), str(first), str(count), str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc, [int(x) for x in proc.stdout.readline().split()]


def test_two_processes_seeded_alike_never_share_a_uid(folder):
    a, taken_a = hold(folder, 8)
    b, taken_b = hold(folder, 8)
    try:
        assert len(taken_a) == len(taken_b) == 8
        assert not set(taken_a) & set(taken_b), (taken_a, taken_b)
        assert all(uids.FIRST <= u < uids.FIRST + uids.COUNT for u in taken_a + taken_b)
    finally:
        for p in (a, b):
            p.stdin.close()
            p.wait(timeout=30)


def test_a_uid_is_free_again_when_its_holder_gives_it_back_or_is_killed(folder, monkeypatch):
    monkeypatch.setattr(uids, "FIRST", 300_000)
    monkeypatch.setattr(uids, "COUNT", 2)  # two uids in all: 300000 and 300001
    killed, [held] = hold(folder, 1, 300_000, 2)
    mine = uids.take()
    assert mine == ({300_000, 300_001} - {held}).pop()
    with pytest.raises(BudgetError, match="All 2 sandbox uids"):  # the other process holds the second
        uids.take()
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert uids.take() == held  # the kernel released the killed holder's lock
    uids.give_back(held)
    uids.give_back(mine)
    assert sorted(os.listdir(folder)) == []  # the lock files go with their uids
    assert {uids.take(), uids.take()} == {300_000, 300_001}
    uids.give_back(300_000)
    uids.give_back(300_001)


def test_taking_a_uid_leaves_pythons_random_state_alone(folder):
    random.seed(1234)
    before = random.getstate()
    uids.give_back(uids.take())
    assert random.getstate() == before


def test_a_folder_others_can_write_to_is_not_trusted(folder, monkeypatch):
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)
    monkeypatch.setattr(uids, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        uid = uids.take()
    assert any("within this process only" in str(w.message) for w in caught)
    assert os.listdir(folder) == []  # nothing written where others could have placed a link
    other = uids.take()
    assert other != uid  # still apart within the process
    uids.give_back(uid)
    uids.give_back(other)


def test_lock_files_of_killed_holders_are_swept_and_held_ones_kept(folder):
    # a trainer killed with uids taken leaves their empty lock files (79 had gathered on this host)
    killed, left = hold(folder, 3)
    alive, held = hold(folder, 2)
    mine = uids.take()
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert sorted(uids.sweep_stale()) == sorted(left)
        assert sorted(int(n) for n in os.listdir(folder)) == sorted([*held, mine])
        assert uids.sweep_stale() == []
    finally:
        alive.stdin.close()
        alive.wait(timeout=30)
        uids.give_back(mine)
    assert sorted(uids.sweep_stale()) == sorted(held)  # it exited without giving them back
    assert os.listdir(folder) == []
