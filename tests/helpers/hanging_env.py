"""An environment whose reset() never returns (one tool, ``add``): the fault suites' hanging environment,
used in-process and, copied into a run folder as a module, by a ``grpokit train`` subprocess."""

import time


class Hang:
    """reset() sleeps forever: no SIGALRM, no async exception can stop a sleep in C."""

    def reset(self, **row):
        time.sleep(3600)

    def add(self, n: str) -> str:
        """Add.

        Args:
            n: amount.
        """
        return n
