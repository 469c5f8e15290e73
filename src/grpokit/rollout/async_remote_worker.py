"""A rollout worker on another host: ``grpokit rollout-worker --connect HOST:PORT`` (rollout/async_remote.py is
the trainer's side).

It connects to a trainer's ``rollout.async_listen`` (retrying until ``--wait`` seconds have passed: it may start
before the trainer), proves the key in GRPOKIT_ROLLOUT_KEY, receives the init record (the policy, by value),
joins its gloo pair with the trainer (rollout/weight_wire.py) and answers jobs as a local worker does
(rollout/async_worker.py) on its ``--device`` (a card of this host's, or its CPU), its weights received
through the pair into host memory (page-locked for a card) and copied into its policy. It exits 0 when the
trainer tells it to stop and 1 with one sentence when the trainer goes away, refuses its key, or cannot be
reached in time; with ``--persist`` it waits for the next trainer instead (a run resumed after a kill), until
one is not reached in time or refuses its key; a ``--device`` this host lacks ends it at once.

This host needs the trainer's Python packages (grpokit, torch, transformers: the same versions, or the pickled
policy may not load, and the batches equal a local worker's only under the same torch build and thread count).
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import torch
import torch.distributed as dist

from .async_remote import KEY_ENV, PlainConn, parse_address, rollout_key
from .async_worker import worker_main
from .cards import is_device_name, missing_card
from .weight_wire import Layout, Receiver, pair_group


class WorkerExit(Exception):
    """The worker's end, in one sentence (exit status 1); ``final`` when waiting for another trainer cannot
    help (a refused key, no trainer within ``--wait``)."""

    def __init__(self, sentence: str, final: bool = False):
        super().__init__(sentence)
        self.final = final


def connect(address: tuple[str, int], key: bytes, wait_s: float) -> PlainConn:
    """The authenticated connection to the trainer, retried every second while it refuses (not listening yet)."""
    deadline = time.monotonic() + wait_s
    where = f"{address[0]}:{address[1]}"
    while True:
        try:
            return PlainConn(Client(address, family="AF_INET", authkey=key))
        except AuthenticationError as e:
            raise WorkerExit(
                f"the trainer at {where} refused this worker's key ({KEY_ENV} differs from its)", final=True
            ) from e
        except (ConnectionRefusedError, ConnectionResetError, EOFError) as e:
            if time.monotonic() >= deadline:
                raise WorkerExit(
                    f"no trainer accepted a connection at {where} within {wait_s:g} s ({type(e).__name__}); is "
                    "rollout.async_listen that address and the run started?",
                    final=True,
                ) from e
            time.sleep(1.0)
        except OSError as e:
            raise WorkerExit(f"cannot connect to the trainer at {where}: {e.strerror or e}", final=True) from e


def _init_record(conn: PlainConn, where: str) -> dict:
    """The trainer's init record; WorkerExit when it does not unpickle here (EOFError/OSError: the trainer went)."""
    try:
        return conn.recv()
    except (EOFError, OSError):
        raise
    except Exception as e:  # noqa: BLE001 - the policy or its sample function does not load on this host
        raise WorkerExit(
            f"the trainer's policy from {where} does not load here ({type(e).__name__}: {e}); this host needs the "
            "trainer's grpokit, torch and transformers, and the module of any sample function it uses"
        ) from e


def serve(
    address: tuple[str, int], key: bytes, *, threads: int = 0, wait_s: float = 600.0, device: str = "cpu"
) -> None:
    """Work for the trainer at ``address`` on ``device`` until it says stop; raises WorkerExit otherwise."""
    conn = connect(address, key, wait_s)
    where = f"{address[0]}:{address[1]}"
    try:
        init = _init_record(conn, where)
        pair = init.pop("pair")
        init["threads"] = threads or torch.get_num_threads()  # this host's cores, not the trainer's share
        init["device"] = device  # this host's, not the trainer's
        store = dist.TCPStore(address[0], pair["store_port"], is_master=False)
        group = pair_group(store, pair["name"], 1, pair["join_s"])
    except (EOFError, OSError, RuntimeError) as e:  # RuntimeError: the pair's rendezvous failed
        conn.close()
        raise WorkerExit(f"the trainer at {where} went away while this worker started ({type(e).__name__})") from e
    except WorkerExit:
        conn.close()
        raise
    params = dict(init["model"].named_parameters())
    layout = Layout.of({name: params[name].data for name in init["trainable"]}, init["trainable"])
    try:
        receiver = Receiver(group, layout, pair["timeout_s"], pinned=device.startswith("cuda"))
        told = worker_main(conn, init, receive=receiver.receive, release=receiver.release)
    finally:
        conn.close()
    if not told:
        raise WorkerExit(
            f"the trainer at {where} closed the connection without telling this worker to stop (it ended or was killed)"
        )


def check_device(device: str) -> None:
    """WorkerExit (final) when ``device`` is not one this host can sample on, before anything connects."""
    if not is_device_name(device):
        raise WorkerExit(f"--device {device!r} is not valid; use cpu, cuda or cuda:N", final=True)
    why = missing_card(device)
    if why:
        raise WorkerExit(f"--device {device}: {why}; use --device cpu", final=True)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    address, key = parse_address(args.connect, "--connect"), rollout_key()
    try:
        check_device(args.device)
    except WorkerExit as e:
        print(f"grpokit rollout-worker: {e}", file=sys.stderr, flush=True)
        return 1
    while True:
        try:
            serve(address, key, threads=args.threads, wait_s=args.wait, device=args.device)
        except WorkerExit as e:
            print(f"grpokit rollout-worker: {e}", file=sys.stderr, flush=True)
            if e.final or not args.persist:
                return 1
        if not args.persist:
            return 0


def parser() -> argparse.ArgumentParser:
    """``grpokit rollout-worker``'s arguments."""
    parser = argparse.ArgumentParser(
        prog="grpokit rollout-worker",
        description="Sample rollouts for a grpokit trainer on another host (rollout.async_remote_workers). "
        f"The secret key comes from {KEY_ENV}, the same as the trainer's.",
    )
    parser.add_argument("--connect", required=True, metavar="HOST:PORT", help="the trainer's rollout.async_listen")
    parser.add_argument("--threads", type=int, default=0, help="intra-op CPU threads (0: torch's default here)")
    parser.add_argument(
        "--device", default="cpu", help="where to sample: cpu, cuda (the current card) or cuda:N (default: cpu)"
    )
    parser.add_argument(
        "--wait", type=float, default=600.0, metavar="S", help="seconds to keep retrying while no trainer listens"
    )
    parser.add_argument(
        "--persist",
        action="store_true",
        help="after a trainer stops or goes away, wait (--wait) for the next one, e.g. the run resumed",
    )
    return parser
