"""A closed console: `grpokit doctor RUN | head`, `grpokit train ... | head`, a `tee` that died.

Every command's sys.stdout and sys.stderr are wrapped (``guard_console``, from cli/errors.py's run_command):
the first write or flush that meets a closed pipe points the stream's file descriptor at os.devnull (every
later write, the interpreter's last flush included, then goes nowhere). What happens next depends on the
command:
* most commands end quietly (``ConsoleClosed``, caught by run_command: exit status 141), as Unix tools do;
  a BrokenPipeError from anything else (a worker's socket) is a fault like any other, named;
* a training run outlives its console (``outlive_console``): its record is its run folder (metrics,
  samples, checkpoints, summary), not its console lines, so it says so once on the other stream while
  that one is open and trains on.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

NOTE = (
    "grpokit: the console's output closed (its pipe's reader went away); the run goes on, its run folder records it\n"
)


class ConsoleClosed(BrokenPipeError):
    """The command's own console (its stdout or stderr) met a closed pipe."""


class _Guarded:
    """`stream` whose closed pipe ends the command (ConsoleClosed) or, outliving, is noted once (the module
    docstring)."""

    def __init__(self, stream: TextIO, other: str) -> None:
        self._stream, self._other, self._lost, self.outlive = stream, other, False, False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._lose()
            return self._stream.write(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._lose()
            self._stream.flush()

    def _lose(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)
        if not self.outlive:
            raise ConsoleClosed(32, "the console's pipe closed")
        if not self._lost:
            self._lost = True
            try:
                getattr(sys, self._other).write(NOTE)
                getattr(sys, self._other).flush()
            except (BrokenPipeError, OSError, ValueError):
                pass  # that one is gone too (`2>&1 | head`): it says nothing when its turn comes

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def guard_console() -> None:
    """Wrap sys.stdout and sys.stderr (the module docstring); streams without a file descriptor (a test's
    capture) are left as they are."""
    for name, other in (("stdout", "stderr"), ("stderr", "stdout")):
        stream = getattr(sys, name)
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue
        if not isinstance(stream, _Guarded):
            setattr(sys, name, _Guarded(stream, other))


def outlive_console() -> None:
    """A training command's first call: for the rest of the process a closed console pipe is noted once and
    the run goes on."""
    guard_console()
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, _Guarded):
            stream.outlive = True
