"""One writer per run folder, with real processes: a second `grpokit train` (--resume or --overwrite)
is refused while the first trains; a holder killed with SIGKILL leaves a lock the next start takes over;
and a job script that always passes --resume works on its first start, after a kill before the first
checkpoint and after a later one. The rules for other hosts (heartbeat) and for filesystems without
flock are checked on lock files written as those holders would leave them."""

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from grpokit.config.sections import ConfigError
from grpokit.record import run_writer
from grpokit.train import run_lock
from helpers.run_locks import dead_pid, write_lock
from helpers.train_processes import (
    STEPS,
    final_state,
    finish,
    logged_steps,
    start,
    wait_for,
    write_setup,
)


@pytest.mark.slow
def test_a_second_writer_is_refused_and_a_killed_holders_lock_is_taken_over(tiny_model_dir, tmp_path):
    cfg = write_setup(tmp_path, tiny_model_dir, steps=100_000, save_every=2)  # never ends before the kill
    run = tmp_path / "run"
    first = start(["--config", str(cfg), "--out", str(run)], tmp_path)
    try:
        wait_for(lambda: len(logged_steps(run)) >= 2, first)
        holder = json.loads((run / "run.lock").read_text())
        assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
        for args in (["--resume", str(run)], ["--config", str(cfg), "--out", str(run), "--overwrite"]):
            rc, _, err = finish(start(args, tmp_path))
            assert rc == 2
            lines = [l for l in err.splitlines() if l.startswith("grpokit")]
            assert len(lines) == 1 and lines[0].startswith(
                f"grpokit: error: run folder {str(run)!r} is in use by another "
                f"grpokit process (pid {first.pid} on host {holder['host']}, started "
            )
        assert (
            run / "checkpoints"
        ).is_dir() and first.poll() is None  # the first run's folder untouched, still training
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert json.loads((run / "run.lock").read_text())["pid"] == first.pid  # left behind by the kill
    done = logged_steps(run)
    rc, out, err = finish(start(["--resume", str(run), f"train.steps={max(done) + 1}"], tmp_path))
    assert rc == 0, err[-2000:]
    assert f"taking over {run.resolve()}/run.lock from pid {first.pid} on host" in out
    assert "which is no longer running" in out
    steps = logged_steps(run)
    assert steps == list(range(1, len(steps) + 1)) and not (run / "run.lock").exists()


@pytest.mark.slow
def test_a_job_that_always_passes_resume_works_on_every_start(tiny_model_dir, tmp_path, reference):
    cfg = write_setup(tmp_path, tiny_model_dir)  # save_every=1000: no checkpoint until the end
    job = ["--config", str(cfg), "--resume", str(tmp_path / "run")]
    run = tmp_path / "run"

    first = start(job, tmp_path)  # the first start: no folder yet
    wait_for(lambda: len(logged_steps(run)) >= 2, first)
    first.send_signal(signal.SIGKILL)  # killed before its first checkpoint
    first.wait()
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())

    again = start(job, tmp_path)  # the restart: step 0 again, its records replaced
    wait_for(lambda: (run / "checkpoints" / f"step-{STEPS:06d}").exists() or again.poll() is not None, again)
    rc, out, err = finish(again)
    assert rc == 0, err[-2000:]
    assert f"{run} holds no checkpoint yet, so --resume starts the run again from step 0" in out
    assert logged_steps(run) == list(range(1, STEPS + 1))
    w, m = final_state(run)
    w_ref, m_ref = reference
    assert m == m_ref and all((w[k] == w_ref[k]).all() for k in w)

    rc, out, err = finish(start(job, tmp_path))  # a start after the run finished: resumes at its end, trains nothing
    assert rc == 0 and logged_steps(run) == list(range(1, STEPS + 1)), err[-2000:]


def test_resume_on_a_new_folder_starts_a_new_run_there(tiny_model_dir, tmp_path):
    cfg = write_setup(tmp_path, tiny_model_dir, steps=1)
    rc, out, err = finish(start(["--config", str(cfg), "--resume", str(tmp_path / "new")], tmp_path))
    assert rc == 0, err[-2000:]
    assert f"{tmp_path / 'new'} holds no checkpoint yet, so --resume starts a new run there" in out
    assert logged_steps(tmp_path / "new") == [1]


# ---------------------------------------------------------------- the rules, on lock files left as holders leave them


def test_a_lock_of_a_dead_pid_or_a_reused_one_is_taken_over_without_flock(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "_flock", lambda fd: None)  # a filesystem without flock: the pid rule decides
    said = []
    for fields in ({"pid": dead_pid()}, {"pid": os.getppid(), "pid_start": "1"}):  # gone; reused (other start time)
        write_lock(tmp_path / "run", **fields)
        lock = run_lock.acquire(tmp_path / "run", log=lambda *a, **k: said.append(a[0]))
        assert json.loads((tmp_path / "run" / "run.lock").read_text())["pid"] == os.getpid()
        assert "which is no longer running" in said[-1]
        lock.release()
        assert not (tmp_path / "run" / "run.lock").exists()


def test_a_live_holder_is_refused_without_flock_too(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "_flock", lambda fd: None)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(
            tmp_path / "run", pid=sleeper.pid, pid_start=run_writer.pid_start(sleeper.pid), command="grpokit train x"
        )
        with pytest.raises(ConfigError, match=rf"is in use by another grpokit process \(pid {sleeper.pid} on host "):
            run_lock.acquire(tmp_path / "run")
    finally:
        sleeper.kill()
        sleeper.wait()


def test_another_hosts_lock_is_kept_while_its_heartbeat_moves_and_taken_once_it_is_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "STALE_S", 1.5)
    other = {"host": "node-17", "boot_id": "another-boot", "pid": 4242}
    write_lock(tmp_path / "a", age_s=5.0, **other)  # stale already: taken at once
    said = []
    run_lock.acquire(tmp_path / "a", log=lambda *a, **k: said.append(a[0])).release()
    assert "from pid 4242 on host node-17" in said[-1] and "whose heartbeat stopped 5 s ago" in said[-1]

    write_lock(tmp_path / "b", **other)  # fresh, and it does not move: taken after STALE_S
    t0 = time.monotonic()
    run_lock.acquire(tmp_path / "b", log=lambda *a, **k: None).release()
    assert time.monotonic() - t0 >= 1.0

    write_lock(tmp_path / "c", **other)  # fresh, and its holder beats: alive, refused
    beat = f"import os, time\nfor _ in range(40): time.sleep(0.1); os.utime({str(tmp_path / 'c' / 'run.lock')!r})"
    beating = subprocess.Popen([sys.executable, "-c", beat])
    try:
        with pytest.raises(ConfigError, match="pid 4242 on host node-17"):
            run_lock.acquire(tmp_path / "c", log=lambda *a, **k: None)
    finally:
        beating.kill()
        beating.wait()


def test_a_process_that_lost_its_lock_stops_before_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    lock = run_lock.acquire(tmp_path / "run")
    write_lock(tmp_path / "run", host="node-3", pid=99)  # another host judged it stale and took it
    deadline = time.time() + 10
    while lock.lost_to is None and time.time() < deadline:
        time.sleep(0.05)
    with pytest.raises(ConfigError, match="was taken over by pid 99 on host node-3"):
        lock.check()
    lock.release()
    assert (tmp_path / "run" / "run.lock").exists()  # the new holder's file stays


def test_the_same_process_shares_its_lock_and_a_failed_new_run_leaves_no_empty_folder(tmp_path):
    a = run_lock.acquire(tmp_path / "new")
    b = run_lock.acquire(tmp_path / "new")
    assert a is b
    a.release()
    assert (tmp_path / "new" / "run.lock").exists()
    b.release()
    assert not (tmp_path / "new").exists()


def test_flock_errors_other_than_unsupported_are_raised(tmp_path, monkeypatch):
    import fcntl

    def broken(fd, op):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(fcntl, "flock", broken)
    with pytest.raises(OSError):
        run_lock.acquire(tmp_path / "run")


def test_resume_never_deletes_what_is_not_a_grpokit_run(tiny_model_dir, tmp_path, capsys):
    from grpokit.cli import main

    other = tmp_path / "other"  # another tool's folder, given to --resume by mistake
    (other / "checkpoints").mkdir(parents=True)
    (other / "checkpoints" / "epoch_1.pt").write_bytes(b"weights")
    cfg = write_setup(tmp_path, tiny_model_dir, steps=1)
    assert main(["train", "--config", str(cfg), "--resume", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"train.out={str(other)!r} already holds a run (checkpoints/)" in err
    assert (other / "checkpoints" / "epoch_1.pt").read_bytes() == b"weights" and not (other / "run.lock").exists()


def test_clocks_that_disagree_neither_stall_a_start_nor_take_a_live_holders_lock(tmp_path, monkeypatch):
    """Issue 48: a heartbeat an hour in the future made a start "wait up to 3655 s"; it is watched
    STALE_S by this process's own clock and then taken over, with one line saying why. A heartbeat that
    looks old because its host's clock is behind is still watched, and a live holder is refused."""
    monkeypatch.setattr(run_lock, "STALE_S", 1.5)
    other = {"host": "node-17", "boot_id": "another-boot", "pid": 4242}
    write_lock(tmp_path / "ahead", age_s=-3600.0, **other)
    said = []
    t0 = time.monotonic()
    run_lock.acquire(tmp_path / "ahead", log=lambda *a, **k: said.append(a[0])).release()
    assert 1.0 <= time.monotonic() - t0 < 10
    assert "with a heartbeat 3600 s in the future (the hosts' clocks disagree); waiting up to 2 s" in said[0]
    assert said[-1].endswith("whose heartbeat did not move for 2 s (its time is 3600 s ahead of this filesystem's)")

    lock = tmp_path / "behind" / "run.lock"
    write_lock(tmp_path / "behind", age_s=3600.0, **other)  # alive, but its host's clock is an hour behind
    beat = (
        "import os, sys, time\nfor _ in range(40):\n"
        "    time.sleep(0.1); t = time.time() - 3600; os.utime(sys.argv[1], (t, t))"
    )
    beating = subprocess.Popen([sys.executable, "-c", beat, str(lock)])
    try:
        with pytest.raises(ConfigError, match="pid 4242 on host node-17"):
            run_lock.acquire(tmp_path / "behind", log=lambda *a, **k: None)
    finally:
        beating.kill()
        beating.wait()
