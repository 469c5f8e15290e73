"""Worker initializers for tests of rewards/pool.py (picklable: spawned workers import them by name)."""

import os
import time


def stall_the_first_start() -> None:
    """The first worker to run this (no flag file yet) never gets ready; later ones start at once.
    The flag file is GRPOKIT_TEST_STALL_FLAG."""
    flag = os.environ["GRPOKIT_TEST_STALL_FLAG"]
    try:
        fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    time.sleep(3600)
