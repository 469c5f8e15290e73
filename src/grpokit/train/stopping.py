"""Stopping a run on a signal without losing what it trained: Ctrl-C, and a cluster's preemption.

Slurm and Kubernetes stop a job with SIGTERM and then, after a grace period, SIGKILL; Slurm's
``--signal=USR1@SECONDS`` sends SIGUSR1 that long before the end; a closed terminal sends SIGHUP.
Each of SIGINT, SIGTERM, SIGUSR1 and SIGHUP asks the loop to stop (``requested``):

* the step in progress may go on for ``train.stop_grace_s`` seconds; if it is still sampling or
  scoring then (or a second TERM/USR1/HUP comes), it is cut short: ``StepAbandoned`` is raised in the
  main thread, the loop puts the step's random states and data position back, and the step is
  trained again after ``--resume``. An update already under way is never cut (the weights would be
  half-changed): it finishes, and the step with it. A held-out evaluation may be cut the same way;
* the loop then writes a checkpoint of the last finished step, and ``grpokit train`` exits with
  128 + the signal's number (130 SIGINT, 143 SIGTERM, 138 SIGUSR1, 129 SIGHUP), as a shell reports
  a process the signal ended.

A second SIGINT (Ctrl-C twice) stops at once, without a checkpoint: its handler writes one line and
ends the process with ``os._exit(130)``, waiting on no lock, thread, worker or file, so a loaded run
ends as soon as the main thread next runs Python (raising KeyboardInterrupt instead ran every
``finally`` on the way out, and a loaded run once took over 15 s). What a killed run leaves is what
``kill -9`` leaves: the kernel drops the run's lock, and ``--resume`` continues from the newest
checkpoint that verifies. A signal that was ignored
when the run started (``nohup`` ignores SIGHUP) stays ignored. Only a single process in the main
thread installs the handlers: under torchrun every rank gets the signal at its own point, and they
must not wait for each other at different steps.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
HARD_EXIT_LINE = (
    b"\ngrpokit: interrupted again: stopped at once, without a checkpoint of the step in progress; "
    b"grpokit train --resume continues from the newest checkpoint\n"
)


def exit_now() -> None:
    """End the process at once (a second Ctrl-C): one line by a raw write, then ``os._exit``."""
    try:
        os.write(2, HARD_EXIT_LINE)
    finally:
        os._exit(exit_status(signal.SIGINT))


class StepAbandoned(BaseException):
    """Raised in the main thread when a stop's grace has run out while the step was still sampling or
    scoring (a BaseException, so no ``except Exception`` in between takes it for a fault).
    ``stops_the_run`` tells code that contains untrusted calls (rewards, environments) to let it pass."""

    stops_the_run = True


def exit_status(signum: int) -> int:
    """The exit status of a run stopped by ``signum``: 128 + its number, as a shell reports it."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class GracefulStop:
    """The stop handlers of one ``train()`` call (see the module docstring). ``cuttable()`` says whether
    the main thread is in work that may be cut short now (the step before its update, an evaluation)."""

    def __init__(
        self,
        enabled: bool = True,
        grace_s: float = 10.0,
        cuttable: Callable[[], bool] = lambda: False,
        hard_exit: Callable[[], None] = exit_now,
    ):
        self._hard_exit = hard_exit  # a second Ctrl-C (a test passes a stand-in)
        self.requested = False
        self.signum: int | None = None
        self.cut_due = False  # the grace ran out (or a second signal came): cut what may be cut
        self._grace_s = grace_s
        self._cuttable = cuttable
        self._enabled = enabled and threading.current_thread() is threading.main_thread()
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._nudged = False  # the timer sent the signal
        self._raised = False  # StepAbandoned is raised once per stop

    def _handle(self, signum, frame) -> None:
        if not self.requested:
            self.requested, self.signum = True, signum
            print(
                f"\ngrpokit: {signal_name(signum)}: stopping; the step in progress has {self._grace_s:g} s to finish "
                f"(train.stop_grace_s), then a checkpoint of the last finished step is written"
                + ("; Ctrl-C again to stop at once without one" if signum == signal.SIGINT else ""),
                flush=True,
            )
            if math.isfinite(self._grace_s):  # inf: the step always finishes
                self._timer = threading.Timer(self._grace_s, self._grace_over)
                self._timer.daemon = True
                self._timer.start()
            return
        if self._nudged:  # the grace timer's wake-up, not a second signal from outside
            self._nudged = False
            if not self._previous:  # it arrived while uninstalling: the run's work is over, nothing to cut
                return
        elif signum == signal.SIGINT and self.signum == signal.SIGINT:
            self._hard_exit()  # Ctrl-C twice: stop at once, by construction
            return
        self.cut_if_due(True)

    def cut_if_due(self, due: bool = False) -> None:
        """Raise ``StepAbandoned`` when a cut is due and the main thread's work may be cut (once)."""
        self.cut_due = self.cut_due or due
        if self.cut_due and not self._raised and self._cuttable():
            self._raised = True
            print(
                f"grpokit: cutting the work in progress short ({self._grace_s:g} s grace over, or a second signal); "
                "an unfinished step is trained again at --resume",
                flush=True,
            )
            raise StepAbandoned()

    def _grace_over(self) -> None:
        """Timer thread: wake the main thread with the same signal, whose handler then cuts the step."""
        with self._lock:
            if self._previous:  # still installed: the signal reaches ``_handle``, never a default action
                self._nudged = True
                signal.pthread_kill(threading.main_thread().ident, self.signum)

    def install(self) -> None:
        if not self._enabled:
            return
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is signal.SIG_IGN:  # nohup, or a background job's SIGINT: left ignored
                continue
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            previous, self._previous = self._previous, {}  # the timer sends nothing from here on
        deadline = time.monotonic() + 1.0
        while self._nudged and time.monotonic() < deadline:  # a wake-up the timer already sent reaches
            time.sleep(0.001)  # ``_handle`` first: restored, Python's own SIGINT handler would raise KeyboardInterrupt
        for sig, handler in previous.items():
            signal.signal(sig, handler)
