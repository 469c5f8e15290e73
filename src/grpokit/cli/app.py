"""The command line: ``grpokit train | eval | report | doctor | presets | models | vllm-serve | rollout-worker |
trl grpo`` and ``grpokit --version``.

One error model (docs/FAULTS.md): a user's mistake (bad config value, missing or malformed file,
an occupied run folder) prints one sentence and exits with status 2; a full disk stops the run with
a sentence naming the checkpoint it can resume from (status 1); a fault whose cause is the user's
files or the machine however a library wrapped it (grpokit.train.faults.classify: a damaged weights
file, permission denied, memory) is one sentence naming it (2 or 1); anything else is a fault of
grpokit itself and prints one sentence too (status 1). ``--debug`` (anywhere on the command line) or
GRPOKIT_DEBUG=1 shows the traceback instead. The working directory is on the import path, as
with ``python -m``, so a ``module:function`` reward next to the user's data is found.
"""

from __future__ import annotations

import os
import sys

from . import errors
from .errors import run_command
from .info_commands import cmd_models, cmd_presets
from .run_commands import cmd_doctor, cmd_report
from .train_command import cmd_train, cmd_trl


def cmd_rollout_worker(argv: list[str]) -> int:
    from grpokit.rollout.async_remote_worker import main as worker_main
    from grpokit.train.models import quiet_transformers

    quiet_transformers()  # as the trainer: its warnings name nothing the user can act on
    return worker_main(argv)


def cmd_vllm_serve(argv: list[str]) -> int:
    from grpokit.rollout.vllm_serve import (
        main as serve_main,  # imports no vLLM: --help works without it
    )

    return serve_main(argv, check_folder=_served_checkpoint)


def _served_checkpoint(folder: str) -> None:
    """A run's checkpoint is served only when it verifies against its manifest (train/run_checkpoints.py)."""
    from grpokit.train.run_checkpoints import verify_model_folder

    verify_model_folder(folder)


COMMANDS = {
    "train": cmd_train,
    "eval": lambda argv: cmd_eval(argv),
    "report": cmd_report,
    "doctor": cmd_doctor,
    "presets": cmd_presets,
    "models": cmd_models,
    "vllm-serve": cmd_vllm_serve,
    "rollout-worker": cmd_rollout_worker,
    "trl": lambda argv: cmd_trl(argv),
}


def cmd_eval(argv: list[str]) -> int:
    from .eval import main as eval_main

    return eval_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("GRPOKIT_DEBUG", "").lower() in ("1", "true", "yes")
    argv = [a for a in argv if a != "--debug"]
    errors.DEBUG = debug  # for the commands that catch a fault themselves (set on every call, never inherited)
    if argv[:1] == ["--version"]:
        from grpokit.version import __version__

        print(f"grpokit {__version__}")
        return 0
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m`: rewards beside the data import
        sys.path.insert(0, os.getcwd())
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"grpokit: unknown command {argv[0]!r}; valid commands: {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        print(
            "usage: grpokit {" + ",".join(COMMANDS) + "} ...   (grpokit COMMAND --help for details; grpokit --version)"
        )
        return 0
    return run_command(COMMANDS[argv[0]], argv[1:], debug)


if __name__ == "__main__":
    sys.exit(main())
