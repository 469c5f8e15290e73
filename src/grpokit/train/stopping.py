"""Ctrl-C during training: stop after the step in progress, with a checkpoint.
"""

from __future__ import annotations



class GracefulStop:
    """Ctrl-C during training: the first SIGINT asks the loop to stop after the step in progress
    (``requested``), which then writes a checkpoint, the summary and the report; a second one
    interrupts at once (KeyboardInterrupt). Only a single process in the main thread installs the
    handler: under torchrun every rank gets the signal at its own point, and they must not wait for
    each other at different steps."""

    def __init__(self, enabled: bool = True):
        import signal
        import threading

        self.requested = False
        self._signal = signal
        self._enabled = enabled and threading.current_thread() is threading.main_thread()
        self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\ngrpokit: stopping after the current step (a checkpoint and the report follow); "
              "Ctrl-C again to stop at once", flush=True)

    def install(self) -> None:
        if self._enabled:
            self._previous = self._signal.signal(self._signal.SIGINT, self._handle)

    def uninstall(self) -> None:
        if self._enabled and self._previous is not None:
            self._signal.signal(self._signal.SIGINT, self._previous)
            self._previous = None
