"""A curriculum at the frontier: prompts drawn by how likely their group is to carry a gradient.

A GRPO group whose G completions all get the same reward has zero advantage everywhere: its compute
teaches nothing. Dynamic sampling (DAPO) samples such groups and throws them away; this sampler
instead draws fewer of them. Each bucket b (a prompt, or the value of ``data.curriculum_key``, a
difficulty column) keeps decayed counts of passing completions and of completions seen; its pass rate
is the smoothed ``p = (passes + 1) / (seen + 2)`` (an unseen bucket: 1/2), and its weight the chance
that a group of G has two different outcomes,

    w(p) = 1 - p^G - (1 - p)^G        (1 - 2^(1-G) at p = 1/2; 0 at p = 0 or 1),

floored at ``data.curriculum_floor`` so that a solved or hopeless bucket is still drawn now and then and
its pass rate can move. A batch of n prompts is n distinct prompts drawn without replacement with
probabilities proportional to w (Efraimidis-Spirakis keys ``u^(1/w)``), from a generator seeded by
(seed, position): with the counts in the checkpoint, a resumed run draws what the uninterrupted one did.

"Passing" is a judged value >= ``data.curriculum_threshold`` (1.0: a 0/1 verifier's full reward): the sum of
reward.judge's functions (a format bonus beside the verifier makes no wrong answer pass), or the reward as
trained when reward.judge names none. ``curriculum/zero_std_share`` counts groups flat in the reward as trained
(no gradient), as frac_reward_zero_std does.
"""

from __future__ import annotations

import dataclasses
import random

from grpokit.config.sections import ConfigError
from grpokit.types import Prompt


def frontier_weight(p: float, group_size: int, floor: float) -> float:
    """The chance that a group of ``group_size`` Bernoulli(p) outcomes is not all equal, at least ``floor``."""
    return max(floor, 1.0 - p**group_size - (1.0 - p) ** group_size)


class FrontierSampler:
    """A prompt sampler (the interface of data/prompts.py's PromptSampler) weighted by recent pass rates."""

    def __init__(
        self,
        prompts: list[Prompt],
        seed: int,
        *,
        key: str = "",
        threshold: float = 1.0,
        decay: float = 0.5,
        floor: float = 0.05,
        group_size: int = 8,
    ):
        if not prompts:
            raise ConfigError("the training data has no prompts")
        if not 0.0 <= decay <= 1.0:
            raise ConfigError(f"data.curriculum_decay must be in [0, 1], got {decay}")
        if not 0.0 < floor <= 1.0:
            raise ConfigError(f"data.curriculum_floor must be in (0, 1], got {floor}")
        if key and any(key not in p.columns for p in prompts):
            raise ConfigError(f"data.curriculum_key={key!r} but some training rows have no {key!r} column")
        # each prompt served carries its place in the pool, and observe() finds it by that: never by object
        # identity, which a checkpoint does not keep (an asynchronous run's in-flight prompts resume as copies)
        self.prompts = [dataclasses.replace(p, pool_index=i) for i, p in enumerate(prompts)]
        self.seed, self.position = seed, 0
        self.threshold, self.decay, self.floor, self.group_size = threshold, decay, floor, group_size
        self.buckets = [p.columns[key] if key else i for i, p in enumerate(prompts)]
        self.stats: dict = {}  # bucket -> [decayed passes, decayed completions seen]
        self._tally = [0, 0]  # this step's sampled groups: [all-equal, all]

    def pass_rate(self, bucket) -> float:
        passes, seen = self.stats.get(bucket, (0.0, 0.0))
        return (passes + 1.0) / (seen + 2.0)

    def weights(self) -> list[float]:
        by_bucket = {b: frontier_weight(self.pass_rate(b), self.group_size, self.floor) for b in set(self.buckets)}
        return [by_bucket[b] for b in self.buckets]

    def next_batch(self, n: int) -> list[Prompt]:
        rng = random.Random(self.seed * 1_000_003 + self.position)
        keys = [rng.random() ** (1.0 / w) for w in self.weights()]
        order = sorted(range(len(keys)), key=lambda i: -keys[i])
        picked = [order[k % len(order)] for k in range(n)]  # n > the pool: the pool again, in the same order
        self.position += n
        return [self.prompts[i] for i in picked]

    def observe(self, prompts: list[Prompt], rewards_N, group_size: int, judged_N=None) -> None:
        """Count each group's passing completions into its bucket: a judged value (``judged_N``, reward.judge's;
        None: ``rewards_N``, the reward as trained) of at least the threshold. Prompts not from this pool are
        skipped; every group counts towards the zero-std share, by its rewards."""
        self.group_size = group_size
        totals = [float(r) for r in rewards_N]
        judged = totals if judged_N is None else [float(v) for v in judged_N]
        for g, prompt in enumerate(prompts):
            group = totals[g * group_size : (g + 1) * group_size]
            self._tally[0] += float(max(group) == min(group))
            self._tally[1] += 1
            i = self._place(prompt)
            if i is None:
                continue
            b = self.buckets[i]
            passes, seen = self.stats.get(b, (0.0, 0.0))
            verdicts = judged[g * group_size : (g + 1) * group_size]
            self.stats[b] = [
                self.decay * passes + sum(v >= self.threshold for v in verdicts),
                self.decay * seen + len(group),
            ]

    def _place(self, prompt: Prompt) -> int | None:
        """The prompt's place in this pool, None for a prompt this pool did not serve."""
        i = prompt.pool_index
        if i is None or not 0 <= i < len(self.prompts):
            return None
        mine = self.prompts[i]
        return i if (mine.text, mine.ids) == (prompt.text, prompt.ids) else None

    def metrics(self) -> dict[str, float]:
        """``curriculum/zero_std_share``: the share of this step's sampled groups whose rewards were all
        equal (every round's, beside dynamic sampling's dropped groups and a plain run's frac_reward_zero_std);
        ``curriculum/buckets_seen``; ``curriculum/mean_pass_rate`` over the buckets seen."""
        flat, groups = self._tally
        self._tally = [0, 0]
        rates = [self.pass_rate(b) for b in self.stats]
        return {
            "curriculum/zero_std_share": flat / groups if groups else float("nan"),
            "curriculum/buckets_seen": float(len(self.stats)),
            "curriculum/mean_pass_rate": sum(rates) / len(rates) if rates else float("nan"),
        }

    @property
    def epoch(self) -> float:
        """Epochs served: prompts served over the pool."""
        return self.position / len(self.prompts)

    def state_dict(self) -> dict:
        return {
            "position": self.position,
            "group_size": self.group_size,
            "stats": {b: list(v) for b, v in self.stats.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.position, self.group_size = int(state["position"]), int(state.get("group_size", self.group_size))
        self.stats = {b: list(v) for b, v in state.get("stats", {}).items()}
