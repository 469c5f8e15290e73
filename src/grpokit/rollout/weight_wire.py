"""Weights to a rollout worker on another host: one version's trainable tensors as one byte buffer, sent through
a two-rank gloo process group of torch.distributed (rollout/async_remote.py).

torch.distributed is the anchors' own machinery for weights across hosts (verl, OpenRLHF and TRL's vLLM sync
build their groups the same way, outside the training group); gloo runs on any CPU host and sends a buffer
straight from memory into a buffer, both reused from version to version. Chosen by measurement
(bench/weight_sync.py, bench/RESULTS.md): on loopback a version of SmolLM2-135M (540 MB) reached a worker's
policy in 0.17 s this way, against 1.41 s pickled down the worker's control connection (fresh bytes objects
at every version, their pages touched each time) and 0.41 s through the local workers' shared memory.

Each remote worker has its own pair with the trainer (rank 0 the trainer, rank 1 the worker), so a worker that
dies or hangs breaks only its own pair: a broadcast group of all workers would stall every worker on one. The
pairs meet through one TCPStore of the trainer's within the start's deadline; each send and receive has the
pool's deadline (``rollout.async_timeout_s``), after which it raises instead of waiting. The network interface
is gloo's choice, as for torch.distributed itself: GLOO_SOCKET_IFNAME names it where the host name does not
resolve to the one the workers reach.

The buffer holds the tensors in the init record's order (``trainable``), each at an offset aligned to
``ALIGN`` bytes, so that each one is a view of the received buffer in its own dtype.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

ALIGN = 64
"""Byte alignment of each tensor in the buffer: a multiple of every dtype's size, so a slice views as its dtype."""


@dataclass(frozen=True)
class Layout:
    """Where each trainable tensor lies in a version's buffer: ``(name, dtype, shape, offset, nbytes)``."""

    entries: tuple[tuple[str, torch.dtype, tuple[int, ...], int, int], ...]
    nbytes: int

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor], names: list[str]) -> Layout:
        entries, offset = [], 0
        for name in names:
            t = tensors[name]
            size = t.numel() * t.element_size()
            entries.append((name, t.dtype, tuple(t.shape), offset, size))
            offset += -(-size // ALIGN) * ALIGN
        return cls(tuple(entries), offset)

    def pack(self, tensors: dict[str, torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """The tensors' bytes in one uint8 buffer (a copy; into ``out`` when given)."""
        buf = torch.empty(self.nbytes, dtype=torch.uint8) if out is None else out
        for name, dtype, shape, offset, size in self.entries:
            t = tensors[name]
            if t.dtype != dtype or tuple(t.shape) != shape:
                raise ValueError(f"tensor {name} is {t.dtype} {tuple(t.shape)}, the layout's {dtype} {shape}")
            buf[offset : offset + size].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
        return buf

    def unpack(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``buf`` as the named tensors (no copy)."""
        return {
            name: buf[offset : offset + size].view(dtype).view(shape)
            for name, dtype, shape, offset, size in self.entries
        }


def pair_group(store: dist.Store, name: str, rank: int, join_s: float) -> dist.ProcessGroup:
    """The two-rank gloo group ``name`` (rank 0 the trainer, 1 the worker); it returns once both have joined,
    and raises when the other has not within ``join_s`` (the start's deadline: a worker joins once it has
    loaded the policy)."""
    return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, 2, datetime.timedelta(seconds=join_s))


def host_buffer(nbytes: int, pinned: bool) -> torch.Tensor:
    """A uint8 buffer in host memory, page-locked where ``pinned`` (the copies to or from a card run at the bus's
    full speed, and gloo reads it as any host memory)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)


class Sender:
    """The trainer's end of a pair: each version packed into the same buffer (the send before has completed),
    so its pages are touched once, not at every version (a fresh 540 MB buffer cost more than the transfer). A
    trainer on a card stages each version through it (gloo sends host memory), page-locked where ``pinned``."""

    def __init__(self, group: dist.ProcessGroup, layout: Layout, timeout_s: float, pinned: bool = False):
        self.group, self.layout, self.timeout_s = group, layout, timeout_s
        self.buf = host_buffer(layout.nbytes, pinned)

    def send(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        """Send one version's tensors to the worker (tagged with the version); raises past ``timeout_s``."""
        self.layout.pack(tensors, out=self.buf)
        self.group.send([self.buf], 1, version).wait(datetime.timedelta(seconds=self.timeout_s))


class Receiver:
    """The worker's end of a pair: each version received into a buffer of its own, reused once the worker
    releases the version (it copied it into its policy, or its batch is over); page-locked where ``pinned`` (a
    worker on a card copies it there)."""

    def __init__(self, group: dist.ProcessGroup, layout: Layout, timeout_s: float, pinned: bool = False):
        self.group, self.layout, self.timeout_s, self.pinned = group, layout, timeout_s, pinned
        self.free: list[torch.Tensor] = []
        self.held: dict[int, torch.Tensor] = {}

    def receive(self, version: int) -> dict[str, torch.Tensor]:
        """The trainer's version ``version``, as views of its buffer; raises past ``timeout_s``."""
        buf = self.free.pop() if self.free else host_buffer(self.layout.nbytes, self.pinned)
        self.group.recv([buf], 0, version).wait(datetime.timedelta(seconds=self.timeout_s))
        self.held[version] = buf
        return self.layout.unpack(buf)

    def release(self, version: int) -> None:
        buf = self.held.pop(version, None)
        if buf is not None:
            self.free.append(buf)
