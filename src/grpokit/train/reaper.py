"""The run ends every process its rewards, tools, environments and sandboxes started.

For the run (``Trainer.train``), the trainer is a child subreaper (grpokit.rewards.process_tree): a
process a reward starts and detaches (a new session, a double fork, a daemon) is re-parented to the
trainer instead of pid 1 when its parent exits, so it stays findable below the trainer. When the run
ends, whether it finished, failed or was stopped by a signal (SIGINT, SIGTERM, SIGUSR1, SIGHUP: each
ends through ``train()``'s ``finally``), every process below the trainer that was not there when the
run started is killed and reaped; the workers of pools still open (the process-wide math verifier
pool, which serves the next run) are kept, their children are not.

What it cannot do: a trainer killed with SIGKILL runs no code, so what its rewards detached lives on
(its pool workers and sandboxes die with it: PR_SET_PDEATHSIG, bwrap's --die-with-parent).
"""

from __future__ import annotations

import ctypes
import logging

from grpokit.rewards.pool import live_worker_pids
from grpokit.rewards.process_tree import PR_SET_CHILD_SUBREAPER, become_subreaper, descendants, end_descendants

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
        self.before = descendants()  # a test's server, a hog: not the run's to end
        self.was_subreaper = _was_subreaper()
        self.active = become_subreaper()
        self.ended: list[int] = []

    def end(self) -> list[int]:
        """Kill and reap what the run started and left running; the pids ended."""
        if not self.active:
            return []
        self.active = False
        self.ended = end_descendants(keep=self.before, keep_pids=live_worker_pids())
        if self.ended:
            log.info("grpokit: ended %d process(es) the run's rewards or tools left running", len(self.ended))
        if not self.was_subreaper:
            try:
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
            except (OSError, AttributeError):
                pass
        return self.ended
