"""The run ends every process its rewards, tools, environments and sandboxes started.

For the run (``Trainer.train``), the trainer is a child subreaper (grpokit.rewards.process_tree): a
process a reward starts and detaches (a new session, a double fork, a daemon) is re-parented to the
trainer instead of pid 1 when its parent exits, so it stays findable. What the run's untrusted calls
started is known: below a reward worker (itself a subreaper, ended with the worker by its pool), or
noted around each call in the trainer's process (``process_tree.watching``: in-process rewards,
environment resets, tool calls). When the run ends, whether it finished, failed or was stopped by a
signal (SIGINT, SIGTERM, SIGUSR1, SIGHUP: each ends through ``train()``'s ``finally``), the reward
pools are closed (ending what is below their workers) and then the noted processes and everything
below them are killed and reaped. Processes trusted code started (a tracker's service, compile
workers) are left alone.

What it cannot do: a trainer killed with SIGKILL runs no code, so what its rewards detached lives on
(its pool workers and sandboxes die with it: PR_SET_PDEATHSIG, bwrap's --die-with-parent).
"""

from __future__ import annotations

import ctypes
import logging

from grpokit.rewards.pool import live_worker_pids
from grpokit.rewards.process_tree import PR_SET_CHILD_SUBREAPER, become_subreaper, end_watched

log = logging.getLogger("grpokit.train")
_PR_GET_CHILD_SUBREAPER = 37


def _was_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        return libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and bool(flag.value)
    except (OSError, AttributeError):
        return False


class RunReaper:
    """Started when a run starts (``start``), ended when it ends (``end``, once; idempotent)."""

    def __init__(self) -> None:
        self.was_subreaper = _was_subreaper()
        self.active = become_subreaper()
        self.ended: list[int] = []

    def end(self) -> list[int]:
        """Kill and reap what the run started and left running; the pids ended."""
        if not self.active:
            return []
        self.active = False
        self.ended = end_watched(keep_pids=live_worker_pids())  # the verifier pool serves the next run
        if self.ended:
            log.info("grpokit: ended %d process(es) the run's rewards or tools left running", len(self.ended))
        if not self.was_subreaper:
            try:
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
            except (OSError, AttributeError):
                pass
        return self.ended
