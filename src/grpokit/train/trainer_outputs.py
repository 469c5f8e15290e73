"""What a run leaves besides its metrics: held-out evaluations (which a stop's run-out grace may cut
short), checkpoints (rank 0 writes, the others wait) and summary.json (how the run ended: finished, stopped by
a signal, or failed). A mixin of ``Trainer`` (train/loop.py)."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

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
)
from . import resume as run_folder
from .evaluate import evaluate, held_out_params
from .model_card import model_card
from .stopping import GracefulStop, StepAbandoned, signal_name


class TrainerOutputs:
    def _evaluate_unless_cut(self, stop: GracefulStop) -> dict[str, float] | None:
        """The held-out evaluation, which a stop's run-out grace may cut short (None: cut or not begun;
        an evaluation changes no training state, so nothing needs putting back)."""
        if stop.cut_due:
            return None
        self._evaluating = True
        try:
            result = self._evaluate()
            self._evaluating = False
        except StepAbandoned:
            self._evaluating = False
            return None
        return result

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
            )

    def save(self, final_eval: dict[str, float] | None = None) -> Path:
        state = checkpoint.TrainerState(
            step=self.step,
            data_position=self.sampler.position,
            data=self.data_identity,
            numerics=self.numerics,
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
        """The run folder taken again (a second train() of this Trainer) and its summary so far: a
        resumed run is marked in progress again (report --watch)."""
        if not self._release_lock.alive:  # a second train() of this Trainer: the folder is taken again
            self.lock = run_lock.acquire(self.run_dir)
            self._release_lock = weakref.finalize(self, self.lock.release)
        summary = run_folder.read_summary(self.run_dir, self.resume_dir is not None)
        if summary.pop("steps", None) is not None and self.dist.is_main:  # resumed: in progress again (report --watch)
            run_folder.write_summary(self.run_dir, summary)
        return summary

    def _run_with_failures_recorded(self, summary: dict[str, Any], stop: GracefulStop) -> dict[str, float] | None:
        """The steps; an error that ends them is written to summary.json (``failed``: the step it stopped after and
        its sentence) before it propagates, so the run folder says how the run ended (the doctor, the report).
        Under torchrun a failing rank other than 0 writes its own record (record/rank_failures.py), and rank 0,
        when what it saw was only a collective broken by another rank, names that rank and its error."""
        summary.pop("failed", None)  # a resumed run is no longer the failed one
        rank_failures.clear(self.run_dir, self.dist.rank, self.dist.world_size)  # nor are its ranks' records
        self._recorded = self.step  # the last step whose metrics line is written (_run_steps moves it)
        try:
            return self._run_steps(stop)
        except Exception as exc:
            if self.lock.lost_to is not None:  # a folder taken over is not ours to write
                raise
            if not self.dist.is_main:
                rank_failure.record(self.run_dir, self.dist.rank, self._recorded, exc)
                raise
            summary["failed"] = failed = rank_failure.failed_entry(self.run_dir, exc, self._recorded, self.dist, 0.0)
            run_folder.write_summary(self.run_dir, summary)  # now: torchrun may end this process any moment
            if self.dist.active and failed.get("rank") is None:  # the failing rank's record may still be on its way
                summary["failed"] = failed = rank_failure.failed_entry(self.run_dir, exc, self._recorded, self.dist)
                run_folder.write_summary(self.run_dir, summary)
            if failed.get("rank", 0) != 0:  # rank 0's own exception is only the broken collective: say whose
                raise rank_failure.RankFailure(failed) from exc
            raise

    def _finish_summary(self, summary: dict[str, Any], stop: GracefulStop, final_eval: dict | None) -> None:
        """A stopped run keeps what it trained (a checkpoint, no final evaluation) and says which signal
        stopped it; a finished one gets its final evaluation. The summary is written."""
        t = self.cfg.train
        interrupted = stop.requested and self.step < t.steps  # a signal: keep what was trained, no final evaluation
        if interrupted and t.save_last and self.step > self.saved_step:
            self.save()
        summary.pop("interrupted", None)
        summary.pop("stop_signal", None)
        if interrupted:
            summary["interrupted"], summary["stop_signal"] = True, signal_name(stop.signum)
        elif final_eval is not None or not stop.requested:
            summary["eval_after"] = final_eval if final_eval is not None else self._evaluate()
        summary["steps"] = self.step
        run_folder.write_summary(self.run_dir, summary) if self.dist.is_main else None
