"""Each rank's failure on record in the run folder.

Under torchrun rank 0 alone writes summary.json, but the error that ends a job is often another rank's (its
reward function raised, its process died); rank 0 then only sees a collective broken under it ("Connection
closed by peer"). So a rank other than 0 that fails writes its own record, ``failed-rank<r>.json`` (its rank,
the last step recorded and its error sentence), replaced whole, before its process exits. Rank 0 names that
rank and its error in summary.json's ``failed`` (train/trainer_outputs.py); the doctor reads the records itself
when rank 0 was stopped before it could write (``job_failure``). A resumed run removes them as it clears
``failed``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

_NAME = re.compile(r"failed-rank(\d+)\.json")


def record_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"failed-rank{rank}.json"


def write(run_dir: Path, rank: int, step: int, error: str, collective: bool = False) -> None:
    """Rank ``rank``'s failure (``collective``: the error is only a collective broken by another rank): replaced
    whole (written under a temporary name, then renamed), so a reader never sees half of it; a folder that
    cannot be written is left as it is (the error itself propagates)."""
    path = record_path(run_dir, rank)
    tmp = path.with_name(f".{path.name}.tmp")
    record = {"rank": rank, "step": step, "error": error, "collective": collective}
    try:
        tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def read(run_dir: Path) -> list[dict[str, Any]]:
    """Every rank's failure record in ``run_dir``, by rank (unreadable ones left out)."""
    out = []
    for path in Path(run_dir).glob("failed-rank*.json"):
        match = _NAME.fullmatch(path.name)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if match and isinstance(record, dict) and isinstance(record.get("error"), str):
            out.append({**record, "rank": int(match.group(1))})
    return sorted(out, key=lambda r: r["rank"])


def clear(run_dir: Path, rank: int, world_size: int) -> None:
    """At the start of a run's steps: this rank's record of an earlier session, and on rank 0 those of ranks
    this job does not have (a resume with fewer processes); each rank removes its own, so none races another's."""
    for path in Path(run_dir).glob("failed-rank*.json"):
        match = _NAME.fullmatch(path.name)
        if match and (int(match.group(1)) == rank or (rank == 0 and int(match.group(1)) >= world_size)):
            path.unlink(missing_ok=True)


def job_failure(summary: dict[str, Any], run_dir: Path) -> dict[str, Any] | None:
    """How the job failed: summary.json's ``failed``, or, when rank 0 wrote none (stopped by torchrun before it
    could), the lowest rank's record (one that is not a collective broken by another first); None when neither
    says so."""
    failed = summary.get("failed")
    if isinstance(failed, dict):
        return failed
    return cause(read(run_dir))


def cause(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The record that names what ended the job: the lowest rank's that is not itself a collective broken by
    another rank first, else the lowest rank's; None without records."""
    return next((r for r in records if not r.get("collective")), records[0]) if records else None
