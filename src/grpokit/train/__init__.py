"""Stage 6, training: the loop (``loop.py``) and what it needs to run: models and LoRA, log-probabilities,
the update, distributed data parallel and FSDP, checkpoints, callbacks.

``from grpokit.train import Trainer, train`` is the public entry point.
"""

from typing import Any

__all__ = ["Trainer", "train"]


def __getattr__(name: str) -> Any:  # lazy: importing a submodule of grpokit.train does not load the loop
    if name in __all__:
        from grpokit.train import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'grpokit.train' has no attribute {name!r}")
