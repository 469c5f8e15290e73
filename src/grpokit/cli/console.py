"""A training run outlives its console: `grpokit train ... | head`, a `tee` that died, a closed terminal pipe.

A run's record is its run folder (metrics, samples, checkpoints, summary), not its console lines, so a
console whose reader went away must not end the run: the first write that meets a closed pipe points the
stream's file descriptor at os.devnull (the write and every later one, the interpreter's last flush
included, then go nowhere), says so once on the other stream while that one is open, and the run goes on.
Other commands end quietly instead (cli/errors.py: exit status 141), as Unix tools do.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

NOTE = (
    "grpokit: the console's output closed (its pipe's reader went away); the run goes on, its run folder records it\n"
)


class _Outliving:
    """`stream` with writes and flushes that survive a closed pipe (the module docstring)."""

    def __init__(self, stream: TextIO, other: str) -> None:
        self._stream, self._other, self._lost = stream, other, False

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
        if not self._lost:
            self._lost = True
            try:
                getattr(sys, self._other).write(NOTE)
                getattr(sys, self._other).flush()
            except (BrokenPipeError, OSError, ValueError):
                pass  # that one is gone too (`2>&1 | head`): it says nothing when its turn comes

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def outlive_console() -> None:
    """Make sys.stdout and sys.stderr survive a closed pipe for the rest of the process (a training command's
    first call). Streams without a file descriptor (a test's capture) are left as they are."""
    for name, other in (("stdout", "stderr"), ("stderr", "stdout")):
        stream = getattr(sys, name)
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue
        if not isinstance(stream, _Outliving):
            setattr(sys, name, _Outliving(stream, other))
