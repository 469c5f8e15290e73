"""Mixing domains into batches by share: one prompt sampler per domain, and a deterministic schedule of
which domain fills each slot.

The schedule is smooth weighted round-robin: before each slot every active domain gains its share in
credit, the domain with the most credit (the first on a tie) fills the slot and pays back the total.
Over any run of slots each domain gets its share to within one prompt, batch after batch, with no
random draw; shares 2:1 over a batch of 6 give 4 and 2 prompts. A stage that trains on some domains
only (train.stages) narrows the active set; the credits start again from zero when the set changes. A
stage naming a domain with share 0 mixes its domains equally (a share-0 domain has no share to mix by).

The state (credits, active set, each domain's sampler) is in every checkpoint, so a resumed run serves
the prompts the uninterrupted one would, also in the middle of a stage.
"""

from __future__ import annotations

from grpokit.types import Prompt

from .domains import COLUMN


class DomainSampler:
    """Batches mixing the domains' samplers (PromptSampler or FrontierSampler each) by ``shares``."""

    def __init__(self, pools: dict, shares: dict[str, float]):
        self.pools, self.shares = pools, dict(shares)
        self.prompts = [p for pool in pools.values() for p in pool.prompts]
        self.active = [d for d in pools if shares[d] > 0]
        self.credit = {d: 0.0 for d in pools}
        self.position = 0

    def set_domains(self, names: list[str] | None) -> None:
        """Train on ``names`` only (None: every domain with a positive share); a change restarts the credits."""
        active = [d for d in self.pools if (d in names if names is not None else self.shares[d] > 0)]
        if active != self.active:
            self.active, self.credit = active, {d: 0.0 for d in self.pools}

    def _weight(self, d: str) -> float:
        # a stage naming a domain with share 0 trains it (the stage named it) but has no shares to mix it by:
        # the stage's domains then share equally (before: weight 0 beside a positive share, never sampled)
        return self.shares[d] if all(self.shares[a] > 0 for a in self.active) else 1.0

    def schedule(self, n: int) -> list[str]:
        """The domain of each of the next ``n`` slots (advances the credits)."""
        weights = {d: self._weight(d) for d in self.active}
        total = sum(weights.values())
        out = []
        for _ in range(n):
            for d in self.active:
                self.credit[d] += weights[d]
            pick = max(self.active, key=lambda d: self.credit[d])  # max keeps the first of equals
            self.credit[pick] -= total
            out.append(pick)
        return out

    def next_batch(self, n: int) -> list[Prompt]:
        slots = self.schedule(n)
        drawn = {d: iter(self.pools[d].next_batch(slots.count(d))) for d in self.active if d in slots}
        self.position += n
        return [next(drawn[d]) for d in slots]

    def observe(self, prompts: list[Prompt], rewards_N, group_size: int, judged_N=None) -> None:
        """Each domain's sampler sees its own groups (their rewards and judged values)."""
        judged_N = rewards_N if judged_N is None else judged_N
        for d, pool in self.pools.items():
            mine = [g for g, p in enumerate(prompts) if p.columns.get(COLUMN) == d]
            if mine:
                rows = [g * group_size + j for g in mine for j in range(group_size)]
                own = [prompts[g] for g in mine]
                pool.observe(own, [rewards_N[i] for i in rows], group_size, judged_N=[judged_N[i] for i in rows])

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for d, pool in self.pools.items():
            out.update({f"domain/{d}/{k}": v for k, v in pool.metrics().items()})
        return out

    @property
    def epoch(self) -> float:
        """Epochs served: prompts served over the pool."""
        return self.position / len(self.prompts)

    def state_dict(self) -> dict:
        return {
            "position": self.position,
            "active": list(self.active),
            "credit": dict(self.credit),
            "pools": {d: pool.state_dict() for d, pool in self.pools.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])
        if "pools" not in state:  # a checkpoint without the domains' state (data_position only)
            return
        self.active, self.credit = list(state["active"]), dict(state["credit"])
        for d, pool in self.pools.items():
            pool.load_state_dict(state["pools"][d])
