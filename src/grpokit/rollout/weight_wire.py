"""Weights to a rollout worker on another host: one version's trainable tensors as one byte buffer, sent through
a two-rank gloo process group of torch.distributed (rollout/async_remote.py).

torch.distributed is the anchors' own machinery for weights across hosts (verl, OpenRLHF and TRL's vLLM sync
build their groups the same way, outside the training group); gloo runs on any CPU host and sends a buffer
straight from memory. On loopback it moved SmolLM2-135M's 540 MB at ~4 GB/s against ~1 GB/s for the same
tensors pickled down the worker's control connection (bench/weight_sync.py, bench/RESULTS.md).

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

    def pack(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """The tensors' bytes in one uint8 buffer (a copy)."""
        buf = torch.empty(self.nbytes, dtype=torch.uint8)
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


def send_version(
    group: dist.ProcessGroup, layout: Layout, version: int, tensors: dict[str, torch.Tensor], timeout_s: float
) -> None:
    """Send one version's tensors to the worker (tagged with the version); raises past ``timeout_s``."""
    group.send([layout.pack(tensors)], 1, version).wait(datetime.timedelta(seconds=timeout_s))


def recv_version(group: dist.ProcessGroup, layout: Layout, version: int, timeout_s: float) -> dict[str, torch.Tensor]:
    """Receive the trainer's version ``version``; raises past ``timeout_s``."""
    buf = torch.empty(layout.nbytes, dtype=torch.uint8)
    group.recv([buf], 0, version).wait(datetime.timedelta(seconds=timeout_s))
    return layout.unpack(buf)
