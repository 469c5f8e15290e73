"""How a run folder's training stands, one rule for every reader of a run folder: the doctor (a note, or
the `run_killed` finding), the report's headline and live reload, ``grpokit report --watch``.

    finished  summary.json has "steps" (the trainer writes it as training ends)
    stopped   ... with "interrupted": a signal stopped it after a checkpoint (train/stopping.py)
    failed    an error ended it: summary.json's "failed", or a rank's record (rank_failures.job_failure)
    running   a live process holds run.lock (record/run_writer.py), or one that cannot be judged from here:
              another host's, read once (its heartbeat's age by this machine's clock is said, not judged:
              the clocks may disagree); ``report --watch`` judges it by watching its time move
    died      it ended without a record: run.lock names a process that is gone (kill -9, the out-of-memory
              killer, a second Ctrl-C, a machine that went down), or no process holds run.lock while
              summary.json (which only the trainer writes, after taking the lock) records no end
    unknown   neither summary.json nor run.lock: a folder another tool wrote, or one being set up

Before this rule a killed run read "in progress" forever: the doctor found nothing to fix (exit 0) and
``report --watch`` never stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .rank_failures import job_failure
from .run_writer import LOCK_FILE, Heartbeat, remote_note, writer_gone

ENDED = ("finished", "stopped", "failed", "died")


@dataclass(frozen=True)
class RunStatus:
    """A run folder's state (the module docstring's table) and, for "died", what shows it (for "running", what
    a reader should know of a holder on another host, else "")."""

    state: str
    why: str = ""

    @property
    def ended(self) -> bool:
        """No process will write this run folder any more (until a ``--resume``)."""
        return self.state in ENDED


def run_status(run_dir: Path, summary: dict[str, Any], heartbeat: Heartbeat | None = None) -> RunStatus:
    """The state of the run in ``run_dir`` whose summary.json holds ``summary`` ({} when missing); ``heartbeat``:
    run.lock watched across the calls of one reader (``report --watch``), None for one look."""
    if "steps" in summary:
        return RunStatus("stopped" if summary.get("interrupted") else "finished")
    if job_failure(summary, Path(run_dir)) is not None:
        return RunStatus("failed")
    gone = writer_gone(Path(run_dir), heartbeat)
    if gone is not None:
        return RunStatus("died", gone)
    if (Path(run_dir) / LOCK_FILE).exists():
        return RunStatus("running", remote_note(Path(run_dir)) if heartbeat is None else "")
    if summary:
        return RunStatus("died", "no process holds run.lock and summary.json records no end")
    return RunStatus("unknown")
