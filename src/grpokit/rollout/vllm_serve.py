"""``grpokit vllm-serve MODEL [vllm serve options]``: stock vLLM's OpenAI server, ready for weight sync.

It runs vLLM's own ``vllm serve`` (``python -m vllm.entrypoints.cli.main serve``, with this Python)
and adds what ``rollout.backend=vllm_server`` needs (protocol: rollout/vllm_client.py):

* ``VLLM_SERVER_DEV_MODE=1``: vLLM then serves its development endpoints, of which grpokit uses
  ``/collective_rpc`` and ``/reset_prefix_cache``. They have no authentication (``--api-key`` only
  guards ``/v1/...`` paths), so the port must only be reachable from the trainer's network;
* ``--worker-extension-cls grpokit.rollout.vllm_worker.WeightSyncExtension``: the methods the trainer
  calls through ``/collective_rpc`` to load new weights from a shared folder;
* ``--logprobs-mode processed_logprobs`` (unless given): logprobs of the distribution that sampled;
* ``--enable-scale-out`` on vLLM >= 0.30 (``SCALE_OUT_FROM``): it serves ``/v1/chat/completions/render``
  and ``/inference/v1/generate``, which image prompts go through (rollout/vllm_images.py), as
  TRL's ``trl vllm-serve`` adds it;
* with ``--lora-rank R`` (a trainer with ``model.lora_rank=R``): ``--enable-lora``, ``--max-lora-rank``
  (the smallest value vLLM accepts that holds R) and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, so
  that only the adapters are synced (rollout/vllm_lora.py).

Everything after MODEL goes to ``vllm serve`` unchanged (``--port``, ``--tensor-parallel-size``, ...).
The vLLM versions whose source this was checked against are ``VLLM_RANGE``; grpokit must be installed
in the server's environment too (the workers import the extension).

Start-up faults that vLLM would report with a long traceback (a local model folder that does not
exist, a port already taken or not a number) are checked first and said in one sentence (``preflight``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
from collections.abc import Callable

from grpokit.config.sections import ConfigError
from grpokit.version import installed

from .vllm_lora import RUNTIME_FLAG, serve_rank
from .vllm_worker import EXTENSION

VLLM_RANGE = ">=0.10.2,<0.34"
"""vLLM versions the protocol was read from (0.10.2 added /collective_rpc; 0.33.0 is the newest read)."""
SCALE_OUT_FROM = "0.30.0"
"""The first vLLM with ``--enable-scale-out`` (the endpoints image prompts use)."""
INSTALL = f"pip install 'grpokit[vllm]' (vllm{VLLM_RANGE}; vLLM serves on a CUDA GPU)"

DESCRIPTION = f"""\
Start vLLM's OpenAI-compatible server for rollout.backend=vllm_server: runs `vllm serve MODEL ...`
with VLLM_SERVER_DEV_MODE=1, --worker-extension-cls {EXTENSION}
and --logprobs-mode processed_logprobs (and --enable-scale-out on vLLM >= 0.30, for image
prompts). --lora-rank R (a trainer with model.lora_rank=R, whose adapters alone are then synced)
adds --enable-lora --max-lora-rank and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True. Options after MODEL go
to `vllm serve` unchanged
(see `vllm serve --help`). Needs vLLM: {INSTALL}.

The development endpoints it enables have no authentication: expose the port only to the trainer.
The trainer connects with rollout.backend=vllm_server rollout.vllm_url=http://HOST:PORT and writes
weights to a folder this server must read at the same path (rollout.vllm_sync_dir; docs/SCALING.md)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grpokit vllm-serve",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="grpokit vllm-serve [--dry-run] [--lora-rank R] MODEL [vllm serve options ...]",
    )
    p.add_argument("--dry-run", action="store_true", help="print the command and environment instead of running them")
    p.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        metavar="R",
        help="the trainer's model.lora_rank: enable vLLM's runtime LoRA loading so that only the adapters are "
        "synced (0, the default: full weights)",
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="Hugging Face id or local folder of the model (the trainer's model.name_or_path); "
        "every option after it goes to `vllm serve` unchanged",
    )
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(grpokit's part: its options and MODEL, vLLM's part): everything after MODEL is vLLM's."""
    skip = False
    for i, a in enumerate(argv):
        if skip:  # the value of --lora-rank R
            skip = False
        elif a == "--lora-rank":
            skip = True
        elif not a.startswith("-"):
            return argv[: i + 1], argv[i + 1 :]
    return argv, []


def has_option(args: list[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in args)


def build_command(
    model: str, vllm_args: list[str], python: str | None = None, scale_out: bool = False, lora_rank: int = 0
) -> tuple[list[str], dict[str, str]]:
    """The ``vllm serve`` command line (run by ``python``, default this interpreter) and the environment
    it needs; ``scale_out``: the vLLM has ``--enable-scale-out`` (see ``scale_out_supported``);
    ``lora_rank`` > 0: runtime LoRA loading for adapters of that rank (the user's own
    ``--max-lora-rank`` is kept)."""
    if has_option(vllm_args, "--worker-extension-cls"):
        raise ConfigError(
            f"grpokit vllm-serve sets --worker-extension-cls to {EXTENSION} itself; "
            "drop the option (or run `vllm serve` yourself with a class that inherits from it)"
        )
    cmd = [
        python or sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        model,
        *vllm_args,
        "--worker-extension-cls",
        EXTENSION,
    ]
    if not has_option(vllm_args, "--logprobs-mode"):
        cmd += ["--logprobs-mode", "processed_logprobs"]
    if scale_out and not has_option(vllm_args, "--enable-scale-out"):
        cmd += ["--enable-scale-out"]
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if lora_rank < 0:
        raise ConfigError(f"grpokit vllm-serve --lora-rank {lora_rank} must be >= 0 (the trainer's model.lora_rank)")
    if lora_rank:
        if not has_option(vllm_args, "--enable-lora"):
            cmd += ["--enable-lora"]
        if not has_option(vllm_args, "--max-lora-rank"):
            cmd += ["--max-lora-rank", str(serve_rank(lora_rank))]
        env[RUNTIME_FLAG] = "True"
    return cmd, env


def scale_out_supported(version: str | None) -> bool:
    """Whether vLLM ``version`` knows ``--enable-scale-out`` (False when vLLM is not installed)."""
    from packaging.version import InvalidVersion, Version

    try:
        return version is not None and Version(version) >= Version(SCALE_OUT_FROM)
    except InvalidVersion:
        return False


def installed_vllm() -> str | None:
    """The installed vLLM's version, or None; the package is not imported (that takes seconds)."""
    return installed("vllm")


def version_note(version: str) -> str | None:
    """A warning when ``version`` is outside ``VLLM_RANGE`` (it may still work, but was not read)."""
    from packaging.specifiers import SpecifierSet

    if version in SpecifierSet(VLLM_RANGE, prereleases=True):
        return None
    return (
        f"grpokit vllm-serve: warning: vLLM {version} is outside the checked range {VLLM_RANGE}; weight "
        "sync may not work"
    )


def option_value(args: list[str], name: str, default: str) -> str:
    """The value of ``--name VALUE`` / ``--name=VALUE`` in vLLM's arguments (the last one wins, as argparse)."""
    value = default
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def preflight(model: str, vllm_args: list[str]) -> None:
    """The start-up faults vLLM reports with a long traceback, checked first and said in one sentence:
    a local model folder that is not there, a port that is not a number or is already taken."""
    if model.startswith(("/", "./", "../", "~")) and not os.path.exists(os.path.expanduser(model)):
        raise ConfigError(
            f"grpokit vllm-serve: the model folder {model} does not exist; give a local folder or a Hugging Face id"
        )
    port_text, host = option_value(vllm_args, "--port", "8000"), option_value(vllm_args, "--host", "") or "0.0.0.0"
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"grpokit vllm-serve: --port {port_text} is not a port number (1-65535)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is not "taken"
        try:
            probe.bind((host, int(port_text)))
        except OSError as e:
            raise ConfigError(
                f"grpokit vllm-serve: cannot listen on {host}:{port_text} ({e.strerror or e}); "
                "stop what uses the port or pass another --port"
            ) from None


def main(argv: list[str], check_folder: Callable[[str], None] = lambda folder: None) -> int:
    """``grpokit vllm-serve``; ``check_folder`` refuses a local model folder that may not be read (the command
    line passes the run-checkpoint rule: a damaged checkpoint is not served)."""
    ours, theirs = split_argv(argv)
    args = parser().parse_args(ours)
    version = installed_vllm()
    cmd, env = build_command(args.model, theirs, scale_out=scale_out_supported(version), lora_rank=args.lora_rank)
    if args.dry_run:
        print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(cmd))
        return 0
    if version is None:
        raise ConfigError(f"grpokit vllm-serve needs vLLM, which is not installed in this environment: {INSTALL}")
    preflight(args.model, theirs)
    if os.path.isdir(os.path.expanduser(args.model)):
        check_folder(os.path.expanduser(args.model))
    note = version_note(version)
    if note:
        print(note, file=sys.stderr)
    shown = " ".join(f"{k}={v}" for k, v in env.items())
    print(f"grpokit vllm-serve: running {shown} {shlex.join(cmd)}", file=sys.stderr, flush=True)
    os.execve(cmd[0], cmd, {**os.environ, **env})  # replaced by vLLM: its signals and exit status are the user's
    return 0  # not reached
