"""The devices rollout workers sample on (rollout.async_worker_device, ``grpokit rollout-worker --device``): which
names are devices, and whether this process can use the card a name picks."""

from __future__ import annotations

import torch


def is_device_name(name: str) -> bool:
    """cpu, cuda (this process's current card) or cuda:N."""
    return name in ("cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit())


def missing_card(name: str) -> str:
    """Why this process cannot sample on the card ``name`` picks, in words; "" when it can (or ``name`` is no card)."""
    if not name.startswith("cuda"):
        return ""
    if not torch.cuda.is_available():
        return "torch sees no CUDA device on this host"
    n = torch.cuda.device_count()
    if ":" in name and int(name[5:]) >= n:
        return f"this host has {n} CUDA device(s), cuda:0 to cuda:{n - 1}"
    return ""
