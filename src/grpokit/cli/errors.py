"""The command line's error model (docs/FAULTS.md): one sentence per fault, the traceback only with --debug.

A user's mistake (``user_errors``) exits with status 2; a full disk, the user's files or the machine
(grpokit.train.faults.classify) and grpokit's own faults are one sentence each too. ``DEBUG`` is the
current ``main()`` call's --debug / GRPOKIT_DEBUG=1, for the commands that catch a fault themselves.
"""

from __future__ import annotations

import os
import sys

from grpokit.config.sections import ConfigError

DEBUG = False  # --debug / GRPOKIT_DEBUG=1 of the current main() call


def say(*args, **kwargs) -> None:
    """Print on the first process only: under torchrun every rank runs this CLI, and the run's lines
    (and a user's mistake, the same sentence on every rank) should appear once, not once per process."""
    if os.environ.get("RANK", "0") == "0":
        print(*args, **kwargs)


def user_errors() -> tuple[type, ...]:
    """The exceptions that carry a user's mistake as one sentence (imported lazily: --help stays light)."""
    from grpokit.record.health import TrainingHealthError
    from grpokit.rewards.spec import RewardError

    return ConfigError, RewardError, TrainingHealthError


def run_command(command, argv: list[str], debug: bool) -> int:
    """The error model: one sentence per fault on stderr, the traceback only with --debug."""
    from .console import ConsoleClosed, guard_console

    guard_console()
    try:
        return command(argv)
    except KeyboardInterrupt:
        print("grpokit: interrupted", file=sys.stderr)
        return 130
    except ConsoleClosed:  # the reader of the output went away (`grpokit doctor RUN | head`): quiet, as Unix tools
        return 141  # 128 + SIGPIPE, what a shell reports for a tool a closed pipe stopped
    except user_errors() as e:
        if debug:
            raise
        say(f"grpokit: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if debug:
            raise
        from grpokit.train.faults import classify
        from grpokit.train.resume import (
            is_storage_fault,  # here: torch only when something failed
        )

        cause = classify(e)  # the user's files, the machine, or (under torchrun) the rank that ended the job
        if is_storage_fault(e):
            print(
                f"grpokit: error: writing {e.filename or 'a file'} failed ({e.strerror}); what was written before is "
                "intact; free space and run the command again",
                file=sys.stderr,
            )
        elif cause is not None:  # the user's files, the machine or another rank, named by cause and place
            print(f"grpokit: error: {cause.sentence}", file=sys.stderr)
            return cause.status
        else:
            print(
                f"grpokit: error: an internal fault stopped the command ({type(e).__name__}: {first_line(e)}); "
                "run it again with --debug for the traceback",
                file=sys.stderr,
            )
        return 1


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else "no message"
