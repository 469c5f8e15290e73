"""Rank 0's account of a failed job under torchrun: its own error, or the error of the rank that ended the job.

When another rank fails (its reward function raises, its process dies), rank 0 only sees a collective break
under it: gloo's "Connection closed by peer", an NCCL error. That sentence names no cause, so rank 0 looks for
the failing rank's own record (record/rank_failures.py, written before that rank's process exits) and puts
that rank and its error in summary.json's ``failed``; the command line prints it (``RankFailure``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from grpokit.record import rank_failures

# what gloo and NCCL say when the other end of a collective went away (gloo raises a plain RuntimeError)
_BROKEN = ("connection closed by peer", "connection reset by peer", "/gloo/", "nccl", "broken pipe")


def is_collective_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that broke (another process ended, a link failed), not a fault of its own."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(marker in text for marker in _BROKEN)


class RankFailure(RuntimeError):
    """Rank 0's error when another rank ended the job: that rank's failure (``failed``, summary.json's entry)."""

    def __init__(self, failed: dict[str, Any]):
        self.failed = failed
        rank = failed.get("rank")
        who = f"rank {rank}" if isinstance(rank, int) else "another rank"
        super().__init__(f"{who} of the job failed after step {failed.get('step', '?')}: {failed.get('error')}")


def failed_entry(run_dir: Path, exc: BaseException, step: int, ctx, wait_s: float = 2.0) -> dict[str, Any]:
    """summary.json's ``failed`` on rank 0 (``ctx``: a distributed.DistContext): ``step`` (the last recorded)
    and ``error``; with several processes also ``rank``, the failing one. Rank 0's own error unless it is a
    broken collective: then the record of the rank that failed (one that is not itself a broken collective
    first), waited for up to ``wait_s`` seconds; none written (a process killed, or ended at once): ``rank``
    None and a sentence that says so."""
    error = f"{type(exc).__name__}: {exc}"
    if not ctx.active:
        return {"step": step, "error": error}
    if not is_collective_error(exc):
        return {"step": step, "rank": 0, "error": error}
    deadline = time.monotonic() + wait_s
    records = rank_failures.read(run_dir)
    while not records and time.monotonic() < deadline:
        time.sleep(0.1)
        records = rank_failures.read(run_dir)
    if records:
        first = rank_failures.cause(records)
        return {"step": step, "rank": first["rank"], "error": first["error"], "rank_0_saw": error}
    return {
        "step": step,
        "rank": None,
        "error": (
            "another process of the job ended without recording its error (killed, or it exited at once: its own "
            f"output says why); rank 0 saw {error}"
        ),
    }


def record(run_dir: Path, rank: int, step: int, exc: BaseException) -> None:
    """A rank other than 0 records its failure before its process exits (record/rank_failures.py)."""
    rank_failures.write(run_dir, rank, step, f"{type(exc).__name__}: {exc}", collective=is_collective_error(exc))
