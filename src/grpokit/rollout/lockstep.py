"""Sampling with a sharded model: every rank runs the same number of forward passes.

Under FSDP each rank holds a shard of every weight, and a forward pass all-gathers the shards
block by block: a collective that every rank must enter, in the same order. The decode loop of
``rollout/hf.py`` stops as soon as *this rank's* rows have finished, so a rank whose completions
were short would leave the others waiting in an all-gather that never completes.

``lockstep(model, any_rank)`` hands the sampler a stand-in for the model whose every forward is
preceded by one vote, "is some rank still sampling?" (``any_rank(True)``, an all-reduce). When the
sampler returns, the rank keeps voting ``False``; while some other rank still votes ``True`` it runs
a one-token forward whose output it throws away, so its all-gathers pair with the busy ranks'.
Once every rank votes ``False`` all of them leave together::

    rank 0 (2 own forwards):  T fwd | T fwd | F idle fwd | F idle fwd | F -> leave
    rank 1 (4 own forwards):  T fwd | T fwd | T fwd      | T fwd      | F -> leave

The vote comes before the model's own hooks, so the collectives of all ranks pair up in order.
One process never takes this path (the trainer uses it only when the model is sharded), so the
1-process decode loop has no collective in it. The stand-in counts calls of the model itself, so a
sampler must run the model through ``model(...)``, which ``rollout/hf.py`` and ``evaluate.py`` do.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch


class LockstepModel:
    """The model, seen through a vote before each forward; every other attribute is the model's."""

    def __init__(self, model: torch.nn.Module, any_rank: Callable[[bool], bool]):
        self._model, self._any_rank = model, any_rank
        self.real_forwards = 0  # this rank's own forwards
        self.idle_forwards = 0  # forwards run only to keep the others company

    def __call__(self, *args: Any, **kwargs: Any):
        self._any_rank(True)  # the others learn that one more forward is coming
        self.real_forwards += 1
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # parameters(), eval(), training, config ...
        return getattr(self._model, name)

    @torch.no_grad()
    def finish(self) -> None:
        """Run throw-away one-token forwards until no rank is sampling any more."""
        while self._any_rank(False):
            device = next(self._model.parameters()).device
            self._model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)
            self.idle_forwards += 1


@contextlib.contextmanager
def lockstep(model: torch.nn.Module, any_rank: Callable[[bool], bool]) -> Iterator[LockstepModel]:
    """``with lockstep(model, ctx.any_rank) as m: generate(m, ...)``; on exit, wait in step for the others.

    Every rank must enter and leave the block (a rank with nothing to sample simply leaves it at
    once and keeps the others company from there).
    """
    stand_in = LockstepModel(model, any_rank)
    yield stand_in
    stand_in.finish()  # not in a ``finally``: after an error the other ranks cannot be met anyway
