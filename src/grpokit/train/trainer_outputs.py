"""What a run leaves besides its metrics: held-out evaluations (which a stop's run-out grace may cut
short), checkpoints (rank 0 writes, the others wait) and summary.json (how the run ended: finished, stopped by
a signal, or failed; train/run_summary.py). A held-out evaluation a stop cut is owed: summary.json says which
step's (``eval_owed``) and the run's exit says a signal stopped it, and ``--resume`` runs it first. A mixin
of ``Trainer`` (train/loop.py)."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import torch

from grpokit.data.domains import COLUMN
from grpokit.record import rank_failures
from grpokit.record.domain_metrics import domain_summary

from . import (
    carried_state,
    checkpoint,
    checkpoint_hooks,
    engines,
    rank_failure,
    run_lock,
    run_summary,
)
from .evaluate import evaluate, held_out_params
from .model_card import model_card
from .stopping import GracefulStop, StepAbandoned, signal_name


class TrainerOutputs:
    _owed_step: int | None = None  # the step whose evaluation the session before left owed (summary.json)
    _cut_step: int | None = None  # the step whose evaluation a stop cut in this session

    def _evaluate_unless_cut(self, stop: GracefulStop) -> dict[str, float] | None:
        """The held-out evaluation, which a stop's run-out grace may cut short (None: cut or not begun; the step
        is remembered as owed. An evaluation changes no training state, so nothing needs putting back)."""
        if not stop.cut_due:
            self._evaluating = True
            try:
                return self._evaluate()
            except StepAbandoned:
                pass
            finally:
                self._evaluating = False
        self._cut_step = self.step  # owed: the next session runs it first (summary.json's eval_owed)
        return None

    def _evaluate(self) -> dict[str, float]:
        """The held-out evaluation: one set, or with data.domains each domain's set by its own verifier
        (``domain/<name>/accuracy`` ...) and ``accuracy`` / ``reward`` over all of them."""
        if not self.eval_prompts:
            return {}
        if not self.domain_eval:
            result = self._evaluate_set(self.eval_prompts, self.eval_runner)
        else:
            sets = {d: [p for p in self.eval_prompts if p.columns.get(COLUMN) == d] for d in self.domain_eval}
            result = domain_summary(
                {d: self._evaluate_set(prompts, self.domain_eval[d]) for d, prompts in sets.items() if prompts}
            )
        self.callbacks("on_evaluate", metrics={f"eval_{k}": v for k, v in result.items()})
        return result

    def _evaluate_set(self, prompts: list, runner) -> dict[str, float]:
        say = None if self.quiet or not self.dist.is_main else (lambda line: print(line, flush=True))
        with engines.sampling_model(
            self.model, self.dist
        ) as model:  # on CPU in batches of 32: a line every few seconds
            # training's hf engine (rollout.engine, generation_kwargs; the run's engine itself with
            # rollout.backend=hf), whatever samples the run (vLLM ...), with a generator of its own: an evaluation
            # draws nothing from training's
            return evaluate(
                model,
                self.tokenizer,
                prompts,
                runner,
                params=held_out_params(self.cfg.rollout),
                eos_token_ids=self.eos,
                episodes=self.episodes,
                convention=self.cfg.reward.convention,
                batch_size=256 if self.device.type == "cuda" else 32,
                progress=say,
                sample=self.hf.turn_sampler(model, torch.Generator()),
            )

    def save(self, final_eval: dict[str, float] | None = None) -> Path:
        state = checkpoint.TrainerState(
            step=self.step,
            data_position=self.sampler.position,
            data=self.data_identity,
            numerics=self.numerics,
            updates=self.updates,
            slices=self.slices,
            round_left=self.round_left,
        )
        hooks = checkpoint_hooks.checkpoint_writers(
            self.model, self.optimizer, self.generator, self.dist, self.cfg.model
        )  # LoRA adapters, every rank's sampler state, FSDP gather
        if self.cfg.train.save_only_model:
            hooks.pop("optimizer_state", None)
        path = self.run_dir / "checkpoints" / f"{checkpoint.PREFIX}{self.step:06d}"
        if self.dist.is_main:  # rank 0 writes; the others wait until the checkpoint is complete
            card = model_card(self.cfg, self.step, [s.name for s in self.runner.specs], final_eval)
            path = checkpoint.save(
                self.run_dir / "checkpoints",
                state,
                self.model,
                self.tokenizer,
                self.optimizer,
                self.scheduler,
                self.generator,
                keep=self.cfg.train.keep_checkpoints,
                card=card,
                extra_state=carried_state.saved_extra(
                    self.stage_states,
                    self.pending,
                    self.optimizer,
                    self.sampler,
                    self.engine_state(),
                    carried_state.reference_state(
                        self.ref_model, self.step, *self.ref_refreshed, self.cfg.algo.ref_refresh_every
                    ),
                ),
                model_only=self.cfg.train.save_only_model,
                protect=self.kept_checkpoint(),
                **hooks,
            )
        self.dist.barrier()
        self.saved_step = self.step
        self.callbacks("on_save", checkpoint=path)
        return path

    def _reopen_summary(self) -> dict[str, Any]:
        """The run folder taken again (a second train() of this Trainer) and its summary so far: a resumed
        run is in progress again, so every key of how its earlier session ended leaves summary.json at once
        (run_summary.reopen; kept under ``earlier_sessions``). The evaluation that session's stop cut is
        remembered (``_owed_evaluation`` runs it)."""
        if not self._release_lock.alive:  # a second train() of this Trainer: the folder is taken again
            self.lock = run_lock.acquire(self.run_dir)
            self._release_lock = weakref.finalize(self, self.lock.release)
        summary = run_summary.read_summary(self.run_dir, self.resume_dir is not None)
        ended = run_summary.reopen(summary)
        self._owed_step, self._cut_step = ended.get("eval_owed"), None
        if ended and self.dist.is_main:
            run_summary.write_summary(self.run_dir, summary)
        return summary

    def _evaluate_before(self, summary: dict[str, Any], stop: GracefulStop) -> None:
        """The held-out evaluation before the first step (``eval_before``), once per run; one a stop cuts is not
        written, so the next session runs it."""
        if "eval_before" in summary:
            return
        before = self._evaluate_unless_cut(stop)
        if before is not None:
            summary["eval_before"] = before
            run_summary.write_summary(self.run_dir, summary) if self.dist.is_main else None

    def _owed_evaluation(self, stop: GracefulStop) -> dict[str, float] | None:
        """The held-out evaluation a stop cut in the session before (summary.json's ``eval_owed``), run first when
        this one resumes from that step's checkpoint; its ``eval/*`` metrics join that step's row of metrics.jsonl
        as an uninterrupted run has them (Recorder.amend). Returned: the final evaluation when no step is left."""
        if self._owed_step is None or self._owed_step != self.step or self.step == 0:
            return None  # none owed, or resumed from another step (those steps are trained and evaluated again)
        result = self._evaluate_unless_cut(stop)
        if result:
            self.recorder.amend({f"eval/{k}": v for k, v in result.items()}, self.step)
        return result

    def _train_recorded(self, summary: dict[str, Any], stop: GracefulStop) -> None:
        """The session from ``on_train_begin`` to its end in summary.json: the evaluation before training, the one
        owed by the session before, the steps, the final save and evaluation (_finish_summary). An error in any
        of them is written to summary.json (``failed``: the step it stopped after and its sentence) before it
        propagates, so the run folder says how the run ended (the doctor's run_failed, the report): a disk that
        fills on the final save is no kill without a record. Under torchrun a failing rank other than 0 writes
        its own record (record/rank_failures.py), and rank 0, when what it saw was only a collective broken by
        another rank, names that rank and its error."""
        rank_failures.clear(self.run_dir, self.dist.rank, self.dist.world_size)  # a resumed run is not the failed one
        self._recorded = self.step  # the last step whose metrics line is written (_run_steps moves it)
        try:
            self.callbacks("on_train_begin")
            self._evaluate_before(summary, stop)  # once per run (a stop may cut it: the next session runs it)
            resumed_at, owed = self.step, self._owed_evaluation(stop)
            final_eval = self._run_steps(stop)
            if self.step == resumed_at and owed is not None:  # no step left: the owed evaluation is the final one
                final_eval = owed
            self._finish_summary(summary, stop, final_eval)
        except Exception as exc:
            if self.lock.lost_to is not None:  # a folder taken over is not ours to write
                raise
            if not self.dist.is_main:
                rank_failure.record(self.run_dir, self.dist.rank, self._recorded, exc)
                raise
            failed = rank_failure.failed_entry(self.run_dir, exc, self._recorded, self.dist, 0.0)
            run_summary.end(summary, failed=failed)
            run_summary.write_summary(self.run_dir, summary)  # now: torchrun may end this process any moment
            if self.dist.active and failed.get("rank") is None:  # the failing rank's record may still be on its way
                failed = rank_failure.failed_entry(self.run_dir, exc, self._recorded, self.dist)
                run_summary.end(summary, failed=failed)
                run_summary.write_summary(self.run_dir, summary)
            if failed.get("rank", 0) != 0:  # rank 0's own exception is only the broken collective: say whose
                raise rank_failure.RankFailure(failed) from exc
            raise

    def _finish_summary(self, summary: dict[str, Any], stop: GracefulStop, final_eval: dict | None) -> None:
        """A stopped run keeps what it trained (a checkpoint) and says which signal stopped it, and which step's
        held-out evaluation the stop cut (``eval_owed``: a stop during the final evaluation is a stop too, not a
        finished run); a finished one gets its final evaluation. The summary is written."""
        t = self.cfg.train
        # a signal before the end, or one that cut an evaluation: keep what was trained; the next session goes on
        interrupted = stop.requested and (not self._finished() or self._cut_step is not None)
        if interrupted and t.save_last and self.step > self.saved_step:
            self.save()
        if interrupted:
            owed = {} if self._cut_step is None else {"eval_owed": self._cut_step}
            run_summary.end(summary, steps=self.step, interrupted=True, stop_signal=signal_name(stop.signum), **owed)
        elif final_eval is not None or not stop.requested:
            run_summary.end(
                summary, steps=self.step, eval_after=final_eval if final_eval is not None else self._evaluate()
            )
        else:
            run_summary.end(summary, steps=self.step)
        run_summary.write_summary(self.run_dir, summary) if self.dist.is_main else None
