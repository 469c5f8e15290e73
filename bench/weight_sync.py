"""How a version's weights reach a rollout worker: the three ways grpokit could send them, timed end to end
(issue 50 item 1: "choose by measurement and say why").

    PYTHONPATH=src python bench/weight_sync.py --reps 5

A real receiving process (spawned) gets SmolLM2-135M-Instruct's trainable tensors (all 272, 540 MB in
float32) and a LoRA-sized subset (rank-16 adapters' worth of bytes: the q/v projections' first 16 rows and
columns), ``--reps`` versions each, and copies each version into its own parameters, as a worker does:

- ``gloo``: the shipped path of a remote worker (rollout/weight_wire.py): one packed buffer through a two-rank
  gloo pair of torch.distributed;
- ``pickle``: the same tensors pickled by value down the worker's control connection (rollout/async_remote.py's
  PlainConn), what a worker would get without a second channel;
- ``shm``: the local workers' path (rollout/async_workers.py): the snapshot moved to shared memory, its
  handles down a pipe; one host only, shown for scale.

Each figure is the sender's wall time from the start of a version to the receiver's acknowledgement that it
is in its parameters (median of ``--reps``), on loopback: across hosts the network's bandwidth bounds the
first two. Writes a JSON line per (payload, method) to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpokit.rollout.async_remote import PlainConn  # noqa: E402
from grpokit.rollout.weight_wire import Layout, Receiver, Sender, pair_group  # noqa: E402
from workload import smollm2_dir  # noqa: E402

METHODS = ("gloo", "pickle", "shm")


def payloads() -> dict[str, dict[str, torch.Tensor]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir(), torch_dtype=torch.float32)
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    lora = {n: t[:16, :16].clone() for n, t in full.items() if n.endswith(("q_proj.weight", "v_proj.weight"))}
    return {"full": full, "lora": lora}


def receive(conn, pipe, store_port: int, shapes: dict) -> None:
    """The worker's side: for each (payload, method, reps) announced, receive and copy each version, ack it."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", store_port, is_master=False)
    group = pair_group(store, "bench", 1, 60.0)
    while (what := conn.recv()) is not None:
        payload, method, reps = what
        params = {n: torch.empty(s, dtype=torch.float32) for n, s in shapes[payload].items()}
        receiver = Receiver(group, Layout.of(params, list(params)), 60.0)
        for version in range(reps):
            if method == "gloo":
                got = receiver.receive(version)
            elif method == "pickle":
                got = conn.recv()
            else:
                got = pipe.recv()
            for n, t in got.items():
                params[n].copy_(t)
            receiver.release(version)  # as a worker does once a version is in its policy
            conn.send(version)


def run(reps: int) -> list[dict]:
    import socket
    from multiprocessing.connection import Listener

    import torch.distributed as dist

    data = payloads()
    shapes = {k: {n: tuple(t.shape) for n, t in v.items()} for k, v in data.items()}
    ctx = mp.get_context("spawn")
    listener = Listener(("127.0.0.1", 0))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        store_port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False)
    pipe_parent, pipe_child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(listener.address, pipe_child, store_port, shapes))
    proc.start()
    conn = PlainConn(listener.accept())
    group = pair_group(store, "bench", 0, 60.0)
    rows = []
    for payload, tensors in data.items():
        names = list(tensors)
        sender = Sender(group, Layout.of(tensors, names), 60.0)
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        for method in METHODS:
            conn.send((payload, method, reps))
            times = []
            for version in range(reps):
                fresh = {n: t + version for n, t in tensors.items()}  # a new snapshot each version, as published
                t0 = time.perf_counter()
                if method == "gloo":
                    sender.send(version, fresh)
                elif method == "pickle":
                    conn.send(fresh)
                else:
                    pipe_parent.send({n: t.share_memory_() for n, t in fresh.items()})
                assert conn.recv() == version
                times.append(time.perf_counter() - t0)
            s = statistics.median(times)
            rows.append({"payload": payload, "method": method, "MB": nbytes / 1e6, "s": s, "MB/s": nbytes / 1e6 / s})
            print(json.dumps(rows[-1]), flush=True)
    conn.send(None)
    proc.join(30)
    return rows


def _child(address, pipe, store_port: int, shapes: dict) -> None:
    from multiprocessing.connection import Client

    receive(PlainConn(Client(address)), pipe, store_port, shapes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    run(args.reps)


if __name__ == "__main__":
    main()
