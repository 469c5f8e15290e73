"""One thread that starts every worker process of this process's pools (rewards/pool.py).

PR_SET_PDEATHSIG fires when the *thread* that started a child ends, not the process: a worker started
from a short-lived thread (a reward runner's thread pool) would be killed with it. Starting every worker
from one thread that lives as long as the process ties the workers' lives to the process, as intended.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

_spawner: "queue.Queue[tuple[Callable[[], Any], list, threading.Event]] | None" = None
_spawner_lock = threading.Lock()


def _spawner_loop(requests: "queue.Queue[tuple[Callable[[], Any], list, threading.Event]]") -> None:
    while True:
        fn, box, done = requests.get()
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed back to the caller
            box.append((False, exc))
        done.set()


def in_spawner_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` in one thread that lives as long as the process.

    PR_SET_PDEATHSIG fires when the *thread* that started the child ends, not the process: a worker
    started from a short-lived thread (a reward runner's thread pool) would be killed with it. Starting
    every worker from this thread ties the workers' lives to the process, as intended.
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = queue.Queue()
            threading.Thread(target=_spawner_loop, args=(_spawner,), name="grpokit-pool-spawner", daemon=True).start()
    box: list = []
    done = threading.Event()
    _spawner.put((fn, box, done))
    done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value
