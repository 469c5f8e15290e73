"""transformers' memory metrics (``skip_memory_metrics=False``) for grpokit.trl's GRPOTrainer.

transformers' own ``TrainerMemoryTracker`` measures them, so the keys and their meaning are transformers':
the process's resident-memory deltas (``<stage>_mem_cpu_alloc_delta``, ``<stage>_mem_cpu_peaked_delta``)
and, where CUDA is, the device allocator's (``<stage>_mem_gpu_*``), for ``__init__`` (``init_*`` and
``before_init_mem_*``, reported with the first train() or evaluate()), ``train()`` and ``evaluate()``; an
evaluation inside train() is not measured apart, as in transformers. The tracker names the stage it starts
by its caller's function name, so GRPOTrainer's ``__init__``, ``train`` and ``evaluate`` call ``start()``
themselves; ``stop`` names the stage. grpokit loads the model at the run's first use, not in ``__init__``:
the load counts in the first train() or evaluate() rather than in ``init_*``.
"""

from __future__ import annotations

from transformers.trainer_utils import TrainerMemoryTracker

__all__ = ["TrainerMemoryTracker", "abandon", "empty_device_cache", "stop"]


def stop(tracker: TrainerMemoryTracker, stage: str, metrics: dict | None = None) -> None:
    """End ``stage``'s measurement; its deltas (and __init__'s, the first time) join ``metrics``."""
    if tracker.skip_memory_metrics:  # transformers' stop() would read what a skipping tracker never set
        return
    tracker.stop(stage)
    if metrics is not None:
        tracker.update_metrics(stage, metrics)


def abandon(tracker: TrainerMemoryTracker, stage: str) -> None:
    """``stage`` ended by an exception: its measurement stops (the tracker's peak-sampling thread spins until
    then), with no metrics."""
    if not tracker.skip_memory_metrics and tracker.cur_stage == stage:
        tracker.stop(stage)


def empty_device_cache() -> None:
    """torch_empty_cache_steps: release the CUDA caching allocator's unused blocks (nothing to do on CPU)."""
    import torch

    torch.cuda.empty_cache() if torch.cuda.is_available() else None
