"""Rollout workers on other hosts (``rollout.async_remote_workers``): the trainer's side.

A remote worker is ``grpokit rollout-worker --connect HOST:PORT`` (rollout/async_remote_worker.py) on any
host that reaches the trainer. It connects to the trainer's listener (``rollout.async_listen``; under
torchrun rank r listens on PORT + r), and both prove they hold the same secret key (GRPOKIT_ROLLOUT_KEY) with
multiprocessing's HMAC challenge before either unpickles anything. From then on it is a worker of the pool like
a local one (rollout/async_workers.py: the same jobs, answers, deadlines and faults), except:

- its control messages are pickled by value (``PlainConn``): the local workers' shared-memory handles mean
  nothing on another host;
- a version's weights go through the worker's own gloo pair (rollout/weight_wire.py), sent from a thread of
  the trainer (``RemoteConn``), so a worker that stops reading cannot block the trainer: its deadline fires;
- its death is its connection closing (there is no process sentinel across hosts), and a fault closes that
  connection: the worker, once it runs again, finds it closed and exits.

A connection that fails the challenge is refused and counted; the start waits for the configured number of
workers until its deadline, then stops in one sentence naming the address, the workers that came and the
connections refused.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
import pickle
import queue
import socket
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

import torch
import torch.distributed as dist

from grpokit.config.base import ConfigError

from .async_workers import Job, RolloutWorkerError
from .weight_wire import Layout, Sender, pair_group

log = logging.getLogger("grpokit")

KEY_ENV = "GRPOKIT_ROLLOUT_KEY"
"""The environment variable holding the secret the trainer and its remote workers share."""

CLOSE_S = 5.0
"""The longest a closed remote worker's sender thread is waited for (a send in flight to a stopped worker)."""

CHALLENGE_S = 10.0
"""How long a new connection has to prove the key before it is cut off."""

MIN_KEY = 16
"""The fewest characters a key may have: it is all that stands between the network and an unpickling."""


def rollout_key() -> bytes:
    """The shared secret, from GRPOKIT_ROLLOUT_KEY; refused in one sentence when missing or short."""
    key = os.environ.get(KEY_ENV, "")
    if len(key) < MIN_KEY:
        got = "is not set" if not key else f"has {len(key)} characters"
        raise ConfigError(
            f"remote rollout workers need a secret key of at least {MIN_KEY} characters in {KEY_ENV} (the same on "
            f"the trainer and every worker; it {got}), e.g. export {KEY_ENV}=$(python -c 'import secrets; "
            "print(secrets.token_hex(16))')"
        )
    return key.encode()


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host, port); refused in one sentence naming ``what`` otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or ":" in host or "[" in host:
        raise ConfigError(
            f"{what}={text!r} is not HOST:PORT with an IPv4 address or host name and a port in 1..65535 "
            "(e.g. 0.0.0.0:29710 to accept workers from other hosts, 127.0.0.1:29710 for this one only)"
        )
    return host, int(port)


class PlainConn:
    """A multiprocessing Connection whose messages are pickled by value with the standard pickler (tensors
    as their bytes), not by torch.multiprocessing's shared-memory handles."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, obj) -> None:
        self.conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self):
        return pickle.loads(self.conn.recv_bytes())

    def poll(self, timeout: float = 0.0) -> bool:
        return self.conn.poll(timeout)

    def fileno(self) -> int:
        return self.conn.fileno()

    def close(self) -> None:
        self.conn.close()


class RemoteConn(PlainConn):
    """The trainer's end of one remote worker. A job or a pushed version goes down the connection without its
    tensors, which a sender thread then sends through the worker's gloo pair, in the same order (each tagged
    with its version). The init record gains the pair's rendezvous."""

    def __init__(self, conn, *, store: dist.Store, name: str, timeout_s: float, join_s: float):
        super().__init__(conn)
        # the worker reaches the store at the host it connected to, on the store's port
        self.pair = {"store_port": store.port, "name": name, "timeout_s": timeout_s, "join_s": join_s}
        self.store, self.timeout_s = store, timeout_s
        self.names: list[str] = []
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None  # the sender's failure: the pool names it (async_workers.py _pump)
        self.closed = False
        self.sender = threading.Thread(target=self._send_weights, name=f"grpokit-{name}-weights", daemon=True)
        self.sender.start()

    def send(self, obj) -> None:
        if isinstance(obj, Job):
            versions = {obj.version: obj.tensors, **obj.later}
            super().send(dataclasses.replace(obj, tensors=None, later=dict.fromkeys(obj.later)))
            for version, tensors in versions.items():
                self.outbox.put((version, tensors))
        elif isinstance(obj, tuple) and obj[:1] == ("version",):
            super().send(("version", obj[1], None))
            self.outbox.put((obj[1], obj[2]))
        elif isinstance(obj, dict):  # the init record
            self.names = list(obj["trainable"])
            super().send({**obj, "pair": self.pair})
        else:
            super().send(obj)

    def _send_weights(self) -> None:
        try:
            group = pair_group(self.store, self.pair["name"], 0, self.pair["join_s"])
            sender = None
            while (item := self.outbox.get()) is not None:
                version, tensors = item
                pinned = any(t.is_cuda for t in tensors.values())  # staged from a card
                sender = sender or Sender(group, Layout.of(tensors, self.names), self.timeout_s, pinned)
                sender.send(version, tensors)
        except Exception as e:  # noqa: BLE001 - the worker's fault: the pool names it (async_workers.py _pump)
            # without its traceback, whose frames would keep the pair alive: ending it here (the thread's locals
            # go) ends the worker's receive at once, instead of at its deadline
            self.error = e.with_traceback(None)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.outbox.put(None)
        super().close()
        # the pair ends on the sender's thread before the process exits: a gloo group still being destroyed there
        # while the interpreter finalises aborts the process ("terminate called ..."). A send in flight to a
        # stopped worker does not end before its deadline (gloo cannot cancel it): that wait is bounded here
        self.sender.join(timeout=CLOSE_S)


class RemoteProc:
    """What the pool knows of a remote worker's process: its pid (once it said ready) and host. Killing it
    closes its connection; it has no sentinel (its death is its connection closing)."""

    sentinel = None
    exitcode = None

    def __init__(self, conn: RemoteConn, host: str):
        self.conn, self.host, self.pid, self.alive = conn, host, None, True

    def is_alive(self) -> bool:
        return self.alive

    def kill(self) -> None:
        self.alive = False
        self.conn.close()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the worker to close its end (it was told to stop), reading what it still sends: closing ours
        with its messages unread would reset the connection before it read the stop."""
        deadline = time.monotonic() + (math.inf if timeout is None else timeout)
        while self.alive:
            try:
                if not self.conn.poll(max(0.0, min(deadline - time.monotonic(), 3600.0))):
                    return
                self.conn.conn.recv_bytes()
            except (EOFError, OSError):
                self.alive = False


def _cut_off(sock: socket.socket, cut: threading.Event) -> None:
    """End a connection that has not answered the challenge in time (wakes the thread blocked reading it)."""
    cut.set()
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed meanwhile
        pass


class RemoteListener:
    """The trainer's listener: accepts connections on ``address``, each checked by the key's challenge on its
    own thread (a connection that never answers holds up no other), and hands out the accepted ones."""

    def __init__(self, address: tuple[str, int], key: bytes, timeout_s: float):
        self.key, self.timeout_s = key, timeout_s
        try:
            self.server = socket.create_server(address, backlog=64)
        except OSError as e:
            raise ConfigError(
                f"rollout.async_listen could not listen on {address[0]}:{address[1]} ({e.strerror or e}); "
                "name a free port on an address of this host"
            ) from e
        self.address = address
        # the pairs' rendezvous: a store on an ephemeral port of the same address, handed to each worker
        self.store = dist.TCPStore(address[0], 0, is_master=True, wait_for_workers=False)
        self.accepted: queue.SimpleQueue = queue.SimpleQueue()
        self.refused: list[str] = []
        threading.Thread(target=self._accept, name="grpokit-rollout-listener", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self.server.accept()
            except OSError:  # shut down (close)
                return
            threading.Thread(target=self._challenge, args=(sock, peer), daemon=True).start()

    def _challenge(self, sock: socket.socket, peer) -> None:
        conn = Connection(os.dup(sock.fileno()))  # what multiprocessing's Listener makes of a socket
        # a peer that never answers is cut off (shutdown wakes the blocked read, closing would not)
        cut = threading.Event()
        timer = threading.Timer(CHALLENGE_S, _cut_off, args=(sock, cut))
        timer.start()
        try:
            deliver_challenge(conn, self.key)
            answer_challenge(conn, self.key)
            error = None
        except Exception as e:  # noqa: BLE001 - a wrong key, silence, or not a rollout worker: refused, counted
            error = e
        timer.cancel()
        timer.join()  # it cut the connection, or never will
        sock.close()  # an accepted connection lives on in conn's own descriptor
        if error is None and not cut.is_set():
            self.accepted.put((conn, peer[0]))
            return
        conn.close()
        why = f"no answer within {CHALLENGE_S:g} s" if cut.is_set() else type(error).__name__
        self.refused.append(f"{peer[0]}:{peer[1]} ({why})")
        log.warning(
            "refused a connection to rollout.async_listen from %s:%s: it did not prove the key in %s (%s)",
            peer[0],
            peer[1],
            KEY_ENV,
            why,
        )

    def take(self, n: int, first: int, start_s: float) -> list[tuple[RemoteConn, RemoteProc]]:
        """The first ``n`` workers to connect (numbered from ``first``), waiting at most ``start_s`` seconds."""
        deadline, got = time.monotonic() + start_s, []
        while len(got) < n:
            try:
                conn, host = self.accepted.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                refused = f"; refused {len(self.refused)}: {', '.join(self.refused[:3])}" if self.refused else ""
                raise RolloutWorkerError(
                    f"{len(got)} of the {n} remote rollout workers (rollout.async_remote_workers) connected to "
                    f"{self.address[0]}:{self.address[1]} within {start_s:g} s{refused}; start each with "
                    f"`grpokit rollout-worker --connect HOST:{self.address[1]}` and the trainer's {KEY_ENV}"
                ) from None
            rc = RemoteConn(
                conn,
                store=self.store,
                name=f"rollout-pair-{first + len(got)}",
                timeout_s=self.timeout_s,
                join_s=start_s,
            )
            got.append((rc, RemoteProc(rc, host)))
        return got

    def close(self) -> None:
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (closing alone would not)
        except OSError:
            pass
        self.server.close()


def host_record(init: dict) -> dict:
    """The init record as a worker on another host gets it: the policy copied to the CPU where it is on a card.
    Pickled by value, a tensor is rebuilt on the device it left, which that host may not have; the worker moves
    the copy to its own ``--device``."""
    model = init["model"]
    tensors = [*model.parameters(), *model.buffers()]
    if all(t.device.type == "cpu" for t in tensors):
        return init
    memo = {}  # each tensor's CPU copy, which the deep copy takes in its place: the card holds no second copy
    for t in tensors:
        cpu = t.detach().to("cpu")
        memo[id(t)] = torch.nn.Parameter(cpu, t.requires_grad) if isinstance(t, torch.nn.Parameter) else cpu
    return {**init, "model": copy.deepcopy(model, memo)}


@dataclass(frozen=True)
class RemoteWorkers:
    """The remote workers a rank's pool waits for: how many, where it listens, the key."""

    count: int
    listen: tuple[str, int]
    key: bytes

    def join(self, first: int, start_s: float, timeout_s: float) -> list[tuple[RemoteConn, RemoteProc]]:
        """The workers, numbered from ``first``, once connected within ``start_s`` (then the listener closes:
        no late joiner); their operations with ``timeout_s``."""
        listener = RemoteListener(self.listen, self.key, timeout_s)
        host, port = self.listen
        print(
            f"grpokit: waiting for {self.count} rollout worker(s) at {host}:{port} "
            f"(grpokit rollout-worker --connect HOST:{port})",
            flush=True,
        )
        try:
            return listener.take(self.count, first, start_s)
        finally:
            listener.close()
