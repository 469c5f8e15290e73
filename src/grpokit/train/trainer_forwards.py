"""Stage 5's passes without gradient: the log-probabilities of the reference, of the policy before its
update (and its mass on the sampler's truncated support) and of any other model the step scores with, a
micro-batch at a time, padded, packed or over a prefix tree as train.packing says. A mixin of ``Trainer``
(train/loop.py), beside its construction (trainer_setup.py) and sampling (trainer_sampling.py)."""

from __future__ import annotations

import torch

from grpokit.rollout.sampling import truncates

from .logprobs import completion_logprobs, completion_logprobs_on_support


class TrainerForwards:
    """Reads ``self.cfg``, ``self.device``, ``self.params`` (the sampler's settings), ``self.model`` and
    ``self.autocast`` (Trainer)."""

    @property
    def packed(self) -> bool:
        """Padding-free passes (train.packing; auto: on CUDA, where padding costs the most; a row too long
        for the model's attention kernel stays padded, train/packing.py)."""
        return self.cfg.train.packing == "packed" or (self.cfg.train.packing == "auto" and self.device.type == "cuda")

    @property
    def prefix_tree(self) -> bool:
        """Shared-prefix passes (train.packing=prefix_tree, train/prefix_tree.py)."""
        return self.cfg.train.packing == "prefix_tree"

    @property
    def loss_temperature(self) -> float:
        """The temperature of every trained distribution (pi_theta, pi_old, pi_ref or a teacher, their KL and
        entropies): algo.loss_temperature, else rollout.temperature. The sampler's own is ``self.params.temperature``,
        which a written generation_config or generation_kwargs may set apart (grpokit.trl); it only picks the
        truncated support that the pi_old pass replays."""
        return self.cfg.algo.loss_temperature or self.cfg.rollout.temperature

    @property
    def replays_support(self) -> bool:
        """Whether the sampler records logprobs of a truncated distribution (top-k, top-p, min-p), which
        the trainer's side of the sampler ratio replays (transformers' generate() records none)."""
        return truncates(self.params) and self.cfg.rollout.engine != "generate"

    def logprobs(self, model, batch, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """No-grad logprobs (and entropies) of the whole batch, micro-batch by micro-batch."""
        return self._no_grad_pass(model, batch, entropy, replay=False)[:2]

    def old_logprobs(self, batch, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``logprobs`` of the policy before the update, plus the log of its mass on the sampler's truncated
        support (top-k / top-p / min-p replayed; None when sampling truncates nothing)."""
        return self._no_grad_pass(self.model, batch, entropy, replay=self.replays_support)

    @torch.no_grad()
    def _no_grad_pass(self, model, batch, entropy: bool, replay: bool):
        model.eval()
        mbs = self.cfg.train.micro_batch_size or batch.input_ids.shape[0]
        kw = dict(with_entropy=entropy, packed=self.packed, prefix_tree=self.prefix_tree)
        with self.autocast():
            parts = [
                completion_logprobs_on_support(model, rows, self.params, temperature=self.loss_temperature, **kw)
                if replay
                else (*completion_logprobs(model, rows, temperature=self.loss_temperature, **kw), None)
                for rows in (batch.rows(slice(s, s + mbs)) for s in range(0, batch.input_ids.shape[0], mbs))
            ]
        return tuple(torch.cat([p[i] for p in parts]) if parts[0][i] is not None else None for i in range(3))
