"""Stage 1's batches: the training prompts served in a seeded order, epoch after epoch.

By default batches run on across an epoch's end, so every prompt is served once an epoch, whatever the batch.
With ``batch`` (data.drop_last, as TRL's RepeatSampler) an epoch serves whole batches only: the prompts left
after the last whole batch of its order wait for a later epoch's order, so an epoch is the data a run has seen
in whole batches (grpokit.trl's logged epoch), and a batch never holds a prompt twice.
"""

from __future__ import annotations

import random

from grpokit.config.sections import ConfigError
from grpokit.types import Prompt


class PromptSampler:
    """Serves batches of prompts in a seeded order, epoch after epoch.

    Its whole state is ``position`` (prompts served so far): the order of epoch e is a permutation
    seeded by ``(seed, e)``, so a resumed run gets exactly the prompts an uninterrupted one would.
    ``batch`` > 0: each epoch serves the first ``len(prompts) // batch * batch`` of its order.
    """

    def __init__(self, prompts: list[Prompt], seed: int, shuffle: bool = True, position: int = 0, batch: int = 0):
        if not prompts:
            raise ConfigError("the training data has no prompts")
        self.prompts, self.seed, self.shuffle, self.position = prompts, seed, shuffle, position
        self.batch = batch
        self.epoch_size = len(prompts) // batch * batch if batch else len(prompts)  # prompts served an epoch
        self._cached: tuple[int, list[int]] = (-1, [])

    def _order(self, epoch: int) -> list[int]:
        if self._cached[0] != epoch:
            order = list(range(len(self.prompts)))
            if self.shuffle:
                random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._cached = (epoch, order)
        return self._cached[1]

    def next_batch(self, n: int) -> list[Prompt]:
        if not self.epoch_size:  # refused when a batch is drawn: building a run (evaluate() first) needs none
            raise ConfigError(
                f"the training data has {len(self.prompts)} prompts, fewer than one batch of {self.batch} "
                "(train.prompts_per_step; under grpokit.trl a generation batch), and only whole batches are served "
                "(data.drop_last=true, as TRL's sampler), so no step can train; give at least "
                f"{self.batch} rows or a smaller batch"
            )
        out = []
        for _ in range(n):
            epoch, k = divmod(self.position, self.epoch_size)
            out.append(self.prompts[self._order(epoch)[k]])
            self.position += 1
        return out

    @property
    def epoch(self) -> float:
        """Epochs served: whole batches of them with ``batch`` (10 prompts, batches of 4: an epoch is 8)."""
        return self.position / self.epoch_size

    def rewind_epoch(self) -> None:
        """Back to the start of the current epoch (transformers' ignore_data_skip: its batches are not skipped)."""
        self.position -= self.position % self.epoch_size

    # What every sampler offers the loop (data/domain_sampler.py, data/curriculum.py keep more state):
    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])

    def observe(self, prompts: list[Prompt], rewards_N, group_size: int, judged_N=None) -> None:
        """A scored batch of its prompts: each completion's reward as trained and its judged value (reward.judge;
        None: the reward). A curriculum learns from it; the plain order does not."""

    def metrics(self) -> dict[str, float]:
        """The sampler's own metrics of the step (none for the plain order)."""
        return {}
