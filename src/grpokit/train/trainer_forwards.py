"""Stage 5's passes without gradient: the log-probabilities of the reference, of the policy before its
update (and its mass on the sampler's truncated support) and of any other model the step scores with, a
micro-batch at a time, padded, packed or over a prefix tree as train.packing says. ``step_logprobs`` is the
one place a step takes them (the loop, and grpokit.trl's ``_generate_and_score_completions`` whose dict
carries them), once a step. A mixin of ``Trainer`` (train/loop.py), beside its construction
(trainer_setup.py) and sampling (trainer_sampling.py)."""

from __future__ import annotations

import torch

from grpokit.algo.pipeline import LogProbs, StepSettings, needed_logprobs
from grpokit.rollout.sampling import truncates
from grpokit.types import ScoredBatch, TokenBatch

from . import distill_pass, reference
from .logprobs import completion_logprobs, completion_logprobs_on_support
from .token_batch import make_token_batch


class TrainerForwards:
    """Reads ``self.cfg``, ``self.device``, ``self.params`` (the sampler's settings), ``self.model``,
    ``self.ref_model``, ``self.ref_adapter``, ``self.tokenizer`` and ``self.autocast`` (Trainer); keeps
    ``self.kept_passes``."""

    kept_passes: tuple[ScoredBatch, TokenBatch, LogProbs] | None = None  # step_logprobs(keep=True)'s, until taken

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

    def step_logprobs(self, sb: ScoredBatch, settings: StepSettings, keep: bool = False) -> tuple[TokenBatch, LogProbs]:
        """The token batch of ``sb`` and its log-probabilities before the update (``pre_update_logprobs``),
        taken once a step: ``keep`` holds them for the next call with the same scored batch (the loop's, after
        a sample_and_score slot that needed them first: grpokit.trl's _generate_and_score_completions), which
        gets them back instead of repeating the passes."""
        kept, self.kept_passes = self.kept_passes, None
        if kept is not None and kept[0] is sb:
            return kept[1], kept[2]
        batch = make_token_batch(sb.rollout, self.tokenizer.pad_token_id, self.device)
        lp = self.pre_update_logprobs(batch, settings)
        self.kept_passes = (sb, batch, lp) if keep else None
        return batch, lp

    def pre_update_logprobs(self, batch: TokenBatch, settings: StepSettings) -> LogProbs:
        """What the step's stages read before any update (algo/pipeline.needed_logprobs): pi_old (with its
        entropies and its mass on the sampler's truncated support), pi_ref, or with algo.distill_top_k the
        teacher's top-k and its log pi_ref in one pass (train/distill_pass.py)."""
        a, rows = settings.algo, self.cfg.train.micro_batch_size
        need_old, need_ref, want_entropy = needed_logprobs(settings)
        old, entropy, support = self.old_logprobs(batch, want_entropy) if need_old else (None, None, None)
        ref, top = None, None
        if a.distill_top_k:
            with self.autocast():
                ref, top = distill_pass.teacher_top_k(
                    self.ref_model, batch, a.distill_top_k, self.loss_temperature, a.distill_coef, rows
                )
        elif need_ref:
            ref = reference.reference_logprobs(self.model, self.ref_model, batch, self.logprobs, self.ref_adapter)
        return LogProbs(old, ref, entropy, support, top)

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
