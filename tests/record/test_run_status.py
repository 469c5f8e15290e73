"""How a run folder's training stands (record/run_status.py), one rule for the doctor, the report and
`report --watch`: a run whose process died without a record (kill -9, out of memory) is no run in progress
(hunter's issue B). The lock files are written as holders leave them (helpers.run_locks)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.record.doctor import examine, format_findings
from grpokit.record.report import render_report
from grpokit.record.report_data import load_run
from grpokit.record.run_status import run_status
from helpers.doctor_runs import healthy_rows, write_run
from helpers.run_locks import dead_pid, write_lock

STARTED = {"eval_before": {"accuracy": 0.2}}  # what summary.json holds while a run trains


def test_each_state(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert run_status(run, {}).state == "unknown"  # no summary.json, no run.lock: another tool's folder
    assert run_status(run, {"steps": 3}).state == "finished"
    assert run_status(run, {"steps": 3, "interrupted": True}).state == "stopped"
    assert run_status(run, {"failed": {"step": 2, "error": "E"}}).state == "failed"
    write_lock(run)  # this process: alive
    assert run_status(run, STARTED).state == "running" and not run_status(run, STARTED).ended
    pid = dead_pid()
    write_lock(run, pid=pid)
    status = run_status(run, STARTED)
    assert status.state == "died" and status.ended
    assert status.why.startswith(f"run.lock names pid {pid} on host ") and status.why.endswith("no longer running")
    write_lock(run, pid=os.getppid(), pid_start="1")  # the pid exists but started later: reused, the holder gone
    assert run_status(run, STARTED).state == "died"
    assert run_status(run, {}).state == "died"  # killed before summary.json was written: the lock says it
    assert run_status(run, {"steps": 3}).state == "finished"  # killed after its end was written: finished
    # another host, read once: running, its heartbeat's age by this machine's clock said but not judged (the
    # filesystem's clock, the server's on NFS, may be minutes off this one's); before, 600 s read "died"
    write_lock(run, host="elsewhere", boot_id="other-boot", age_s=5)
    assert run_status(run, STARTED).state == "running"
    write_lock(run, host="elsewhere", boot_id="other-boot", age_s=600)
    status = run_status(run, STARTED)
    assert status.state == "running" and "on another host or boot, with a heartbeat 600 s old by this" in status.why
    (run / "run.lock").write_text("")  # a holder still writing its name: in progress
    assert run_status(run, STARTED).state == "running"
    (run / "run.lock").unlink()  # no holder while summary.json (the trainer's, written under the lock) has no end
    assert run_status(run, STARTED).why == "no process holds run.lock and summary.json records no end"


def test_the_doctor_names_a_killed_run_and_leaves_a_running_one_in_progress(tmp_path: Path) -> None:
    path = write_run(tmp_path / "run", healthy_rows(42))
    (path / "summary.json").write_text(json.dumps(STARTED))
    write_lock(path, pid=dead_pid())
    diag = examine(load_run(path))
    assert [f.code for f in diag.findings] == ["run_killed"] and diag.findings[0].level == "warning"
    f = diag.findings[0]
    assert f.title == "The training process died without a record (killed? out of memory?)"
    assert f.evidence.startswith("the last step recorded is 42 (metrics.jsonl); run.lock names pid ")
    assert f.advice.endswith("then start the run again (it wrote no checkpoint to resume from)")
    assert "in_progress" not in [n.code for n in diag.notes]
    assert main(["doctor", str(path), "--fail-on", "warning"]) == 1
    (path / "checkpoints" / "step-000040").mkdir(parents=True)
    advice = examine(load_run(path)).findings[0].advice
    assert advice.endswith(
        f"then continue with `grpokit train --resume {path}` (from its last checkpoint, step-000040)"
    )
    page = render_report(path)
    assert "42 (died without a record)" in page and "run_killed" in page
    # the same folder while its process lives: in progress, nothing to fix
    write_lock(path)
    diag = examine(load_run(path))
    assert diag.findings == [] and [n.code for n in diag.notes if n.code == "in_progress"] == ["in_progress"]
    assert "the run has not finished (a live process holds run.lock" in format_findings(diag, "run")
    assert main(["doctor", str(path), "--fail-on", "warning"]) == 0
    assert "42 (in progress)" in render_report(path)


@pytest.mark.slow
def test_a_real_run_killed_with_sigkill(tiny_model_dir, tmp_path: Path) -> None:
    """`grpokit train` killed with SIGKILL after two steps (as the out-of-memory killer would): the doctor says
    the process died (exit 1 with --fail-on warning), the report does not read it as in progress."""
    from helpers.train_processes import logged_steps, start, wait_for, write_setup

    cfg = write_setup(tmp_path, tiny_model_dir, steps=100_000)  # never ends before the kill
    run = tmp_path / "run"
    proc = start(["--config", str(cfg), "--out", str(run)], tmp_path)
    try:
        wait_for(lambda: len(logged_steps(run)) >= 2, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert run_status(run, json.loads((run / "summary.json").read_text())).state == "died"
    diag = examine(load_run(run))
    assert diag.findings[0].code == "run_killed" and f"pid {proc.pid} on host" in diag.findings[0].evidence
    assert main(["doctor", str(run), "--fail-on", "warning"]) == 1
    assert "(died without a record)" in render_report(run)


class Clock:
    """A monotonic clock that `sleep` moves (report.watch's `clock` and `sleep`)."""

    def __init__(self, run: Path | None = None):
        self.now, self.run, self.sleeps = 0.0, run, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.sleeps.append(s)
        if self.run is not None:  # a live holder: its heartbeat moves (by its own, skewed clock: 600 s behind)
            t = os.stat(self.run / "run.lock").st_mtime + 10
            os.utime(self.run / "run.lock", (t, t))


def test_another_hosts_run_is_judged_by_its_heartbeat_moving_not_by_the_clocks(tmp_path: Path) -> None:
    """`report --watch` on a run whose lock is another host's: its time compared with this machine's clock said
    "died" for a live holder whose filesystem clock is 600 s behind. Now the lock is looked at on every rewrite
    and judged dead only when its time did not move for STALE_S (60) s of the watcher's own monotonic clock."""
    from grpokit.record.report import watch

    run = write_run(tmp_path / "run", healthy_rows(5))
    (run / "summary.json").write_text(json.dumps(STARTED))
    write_lock(run, host="elsewhere", boot_id="other-boot", age_s=600)  # 600 s old by this clock, but alive
    clock = Clock(run)
    watch([run], tmp_path / "r.html", interval_s=5, max_updates=20, sleep=clock.sleep, clock=clock)
    assert len(clock.sleeps) == 19  # 20 rewrites over 95 s, never ended: the heartbeat moved at each look
    assert "(in progress)" in (tmp_path / "r.html").read_text()
    # the same lock, not touched any more: looked at 0, 5, ... s; unmoved for 65 s (> 60) at the 14th look
    clock = Clock()
    watch([run], tmp_path / "r.html", interval_s=5, max_updates=50, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == [5] * 13
    page = (tmp_path / "r.html").read_text()
    assert "(died without a record)" in page and "whose heartbeat did not move for 65 s" in page
    # one look (the doctor): running, with what it cannot tell said in its note
    diag = examine(load_run(run))
    assert diag.findings == []
    said = format_findings(diag, "run")  # its time is now 600 - 19 * 10 = 410 s behind this machine's
    assert "the run has not finished (run.lock names pid " in said and "with a heartbeat 41" in said
