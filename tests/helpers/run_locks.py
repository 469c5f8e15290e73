"""run.lock files as holders leave them (record/run_writer.py): this process's, a dead pid's, another host's."""

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict

from grpokit.record import run_writer


def write_lock(run, age_s: float = 0.0, **fields) -> dict:
    """A lock naming this process, with `fields` replaced, last touched `age_s` seconds ago."""
    holder = {**asdict(run_writer.this_process()), **fields}
    run.mkdir(exist_ok=True)
    path = run / run_writer.LOCK_FILE
    path.write_text(json.dumps(holder))
    t = time.time() - age_s
    os.utime(path, (t, t))
    return holder


def dead_pid() -> int:
    """The pid of a process that has ended."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid
