"""The guard a script needs when grpokit starts worker processes.

grpokit starts its reward workers with multiprocessing's "spawn" method and its rollout workers
(``rollout.async_workers``) with "forkserver". Both run the parent's main script again in each new
process, under the name ``__mp_main__``, before the worker's own code: a script that builds a trainer at
its top level would start a second run inside every worker (a second writer on the run folder, a stray
new folder, a second model load). ``refuse_in_worker_start`` stops that run at its first line with the
fix, and ``GUARD`` is the fix every "a worker died while starting" message names.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback

from .base import ConfigError

GUARD = 'put the script\'s work under `if __name__ == "__main__":`'

_PREPARE = {"prepare", "_fixup_main_from_path", "import_main_path"}  # multiprocessing/spawn.py's import of main


def reimporting_main() -> bool:
    """True while this process is a multiprocessing child running its parent's main script."""
    flag = getattr(multiprocessing.current_process(), "_inheriting", None)  # CPython sets it around that import
    return bool(flag) if flag is not None else _preparing_on_stack()


def _preparing_on_stack() -> bool:
    """The same, read from the call stack: multiprocessing/spawn.py's preparation is a caller (the
    fallback for a Python whose private flag is gone)."""
    spawn = os.path.join("multiprocessing", "spawn.py")
    return any(
        f.f_code.co_filename.endswith(spawn) and f.f_code.co_name in _PREPARE for f, _ in traceback.walk_stack(None)
    )  # the frames' code objects only: no source line is read


def refuse_in_worker_start(what: str) -> None:
    """Raise ConfigError when ``what`` (a trainer) is being built by a worker process re-running the script."""
    if reimporting_main():
        raise ConfigError(
            f"{what} was created while a worker process that grpokit started was re-running this script's top "
            f"level (multiprocessing starts each reward and rollout worker that way), so {GUARD}; this worker "
            "made no run"
        )
