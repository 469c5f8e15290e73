"""Stage 6, the loop: it calls the stages in pipeline order and holds no math.

    for each step:
        prompts   <- sampler.next_batch(P)                    1  data/prompts.py
        rollout   <- G episodes per prompt (one turn, or tools) 2  rollout/episodes.py, rollout/engine.py, env/
        rewards   <- reward functions, weighted              3  rewards/
        old, ref  <- logprobs the stages need                 5  train/logprobs.py
        adv, mask <- the update's inputs                      4  algo/pipeline.py
        mu slices: accumulate (loss, backward), apply_update   5-6 algo/loss.py, train/update.py,
                   (clip, step) every k slices, maybe across steps     train/update_windows.py
        record metrics, samples, checkpoints, evals           7  train/step_metrics.py, record/, train/checkpoint.py

``Trainer(cfg).train()`` returns the run summary; ``grpokit train`` is a thin wrapper around it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from grpokit.algo.pipeline import MismatchSettings, StepSettings, TISSettings, update_inputs
from grpokit.algo.stage_state import StageState
from grpokit.config.main_guard import refuse_in_worker_start
from grpokit.config.sections import Config
from grpokit.rollout import gec
from grpokit.rollout.collect import collect
from grpokit.rollout.finish import end_ids
from grpokit.rollout.staleness import staleness_metrics
from grpokit.types import ScoredBatch

from . import build, checkpoint, distributed, engines, step_metrics
from .callbacks import Callbacks, RunState
from .memory import cuda_provider
from .model_options import noise_on
from .models import load_tokenizer, refresh_reference
from .reaper import RunReaper
from .stopping import GracefulStop, StepAbandoned
from .timer import Timer
from .trainer_forwards import TrainerForwards
from .trainer_outputs import TrainerOutputs
from .trainer_sampling import TrainerSampling
from .trainer_setup import TrainerSetup
from .trainer_stages import TrainerStages
from .update import Accumulator, Forwards, accumulate, apply_update, update_slices
from .update_windows import batch_counts, stale_slices, window_at, window_counts


class Trainer(TrainerSetup, TrainerSampling, TrainerForwards, TrainerOutputs, TrainerStages):
    """One GRPO run. ``reward_funcs`` (Python callables in TRL's convention) extend or replace the
    configured ones; ``train_rows``/``eval_rows`` replace the configured data. As in TRL's
    GRPOTrainer, ``tools`` (typed, documented functions) and ``environment_factory`` (a class with
    ``reset(**row)`` whose public methods are tools; or a dict name -> class, each row routed by its
    ``environment`` column) make every sample a multi-turn episode (docs/AGENTS.md), and
    ``rollout_func(prompts, trainer) -> dict`` replaces stage 2 altogether.
    ``model`` / ``tokenizer`` (instantiated objects) replace loading ``model.name_or_path``;
    ``callbacks`` are called at the points listed in callbacks.py with ``args`` (default: ``cfg``).
    ``resume`` is a run folder (its newest checkpoint that verifies) or one of its checkpoint folders
    (``RUN/checkpoints/step-N``: exactly that one; the later ones move to ``RUN/earlier-runs/``, resume.py).
    The run folder is locked from here to the end of ``train()`` (train/run_lock.py); with
    ``start_if_no_checkpoint`` (``grpokit train --resume``), a ``resume`` folder without a checkpoint
    starts the run from step 0 there instead of being refused; with ``until_max_updates`` (grpokit.trl) a resumed
    run takes the steps it still needs to reach train.max_updates (trainer_setup.py _steps_to_max_updates)."""

    def __init__(
        self,
        cfg: Config,
        *,
        reward_funcs: list[Callable] | None = None,
        train_rows: list[dict] | None = None,
        eval_rows: list[dict] | None = None,
        resume: str | Path | None = None,
        quiet: bool = False,
        tools: list[Callable] | None = None,
        environment_factory: Callable | dict | None = None,
        rollout_func: Callable | None = None,
        model=None,
        tokenizer=None,
        callbacks: list | None = None,
        args: Any = None,
        start_if_no_checkpoint: bool = False,
        until_max_updates: bool = False,
    ):
        refuse_in_worker_start("a grpokit Trainer")  # before any file or model: a worker re-running the script
        self.cfg = cfg = build.settle_config(cfg, own_rows=train_rows is not None)
        build.check_rollout_func(cfg, rollout_func, tools, environment_factory)
        self.quiet, self.until_max_updates = quiet, until_max_updates
        self._open_run_dir(resume, start_if_no_checkpoint)  # the run folder, locked for one writer
        self._join_processes()  # threads and seeds, torchrun's process group, the device
        self.tokenizer = load_tokenizer(cfg.model, tokenizer)
        self._build_data(train_rows, eval_rows, tools, environment_factory, tokenizer)  # 1-2. episodes, prompts
        self.rollout_func = rollout_func
        self._build_rewards(reward_funcs)  # 3
        self._build_policy(model)  # 5-6. model, reference, optimizer, stage states, memory plan
        self._setup_stages()  # train.stages (trainer_stages.py): based on the fresh optimizer, before a resume
        self._place_run()  # the generator, the prompt sampler, the step (resumed: the checkpoint's)
        self._open_records()  # the saved config, the metrics sinks
        self._build_engine()  # stage 2's engine: hf, vLLM or async
        self._check_numerics()  # kernels, threads, torch: kept in checkpoints, compared with a resumed one's
        self.state = RunState(global_step=self.step, max_steps=cfg.train.steps, is_world_process_zero=self.dist.is_main)
        # what reward functions get as trainer_state: the run's state without its log history (grpokit.trl: TRL's)
        self.reward_state: Callable[[], Any] = lambda: self.state.light()
        self.callbacks = Callbacks(
            callbacks,
            cfg if args is None else args,
            self.state,
            model=self.model,
            processing_class=self.tokenizer,
            optimizer=self.optimizer,
            lr_scheduler=self.scheduler,
        )
        self._warned: set[str] = set()  # what _warn_once said
        self._in_step = self._updating = self._evaluating = False  # where the main thread is, for a stop's cut
        self.kept_checkpoint: Callable[[], Path | None] = lambda: None
        """A checkpoint folder the rotation must keep (grpokit.trl's best model with load_best_model_at_end)."""
        self.loss_stage: Callable[..., None] = accumulate
        """Stage 5: backpropagate one slice into the pending update (update.accumulate's signature);
        grpokit.trl puts a GRPOTrainer subclass's compute_loss here (trl/stages.py)."""
        self.on_sampled: list[Callable[[ScoredBatch], None]] = [self._observe_sampled]
        self.on_inputs: list[Callable[[ScoredBatch, Any, step_metrics.JobRows], None]] = []
        """Called with the step's last scored batch, its update inputs (advantages) and every rank's rows of it
        (step_metrics.job_rows, gathered once a step), before the step's first update (grpokit.trl logs TRL's
        sampling metrics with the round's first optimizer step)."""
        """Called with every batch ``sample_and_score`` returns (grpokit.trl counts TRL's tokens with one; the
        prompt sampler's curriculum learns pass rates from the first)."""
        self._timer = Timer()  # each step starts its own; this one times sampling outside a step (an evaluation)

    # ------------------------------------------------------------------ the loop

    def train(self) -> dict[str, Any]:
        """Evaluate, run the steps until train.steps (or train.max_updates, a callback's stop, a
        signal), evaluate again; the run summary (summary.json) is returned."""
        summary = self._reopen_summary()
        reaper = RunReaper()  # what rewards, tools and sandboxes start ends with the run (train/reaper.py)
        stop = GracefulStop(
            enabled=not self.dist.active,
            grace_s=self.cfg.train.stop_grace_s,  # Ctrl-C, preemption (stopping.py)
            cuttable=lambda: self._evaluating or (self._in_step and not self._updating),
        )
        try:
            stop.install()
            self._train_recorded(summary, stop)  # an error anywhere in it is written to summary.json (failed)
            self.callbacks("on_train_end")
        finally:
            stop.uninstall()
            self._release_lock()
            self.recorder.close()
            self.runner.close()
            self.eval_runner.close()
            self.engine.close()
            reaper.end()
        if self.cfg.record.report and self.dist.is_main:
            _write_report(self.run_dir)
        return summary

    def _run_steps(self, stop: GracefulStop) -> dict[str, float] | None:
        """The steps, each recorded (and evaluated, checkpointed when due); returns the last step's
        evaluation when it had one."""
        t = self.cfg.train
        final_eval = None
        while not self._finished() and not stop.requested:
            self.callbacks("on_step_begin")
            try:
                metrics = self._guarded_step()
            except StepAbandoned:  # a stop's grace ran out before the update: the step is trained again at resume
                break
            self.step = self.state.global_step = self.step + 1
            self.state.epoch = self.sampler.epoch  # whole batches of it with data.drop_last
            control = self._step_end(metrics)
            stopped = control.should_training_stop and not self._finished()  # a callback's stop: saved, evaluated
            last = control.should_training_stop or self._finished()
            if control.should_evaluate or stopped:
                result = self._evaluate_unless_cut(stop) or {}
                metrics.update({f"eval/{k}": v for k, v in result.items()})
                final_eval = result if last and result else None
            self.lock.check()  # another process took the run folder over (its heartbeat rule): stop, write nothing
            self.recorder.log(metrics, self.step)  # one line per step, written before its checkpoint
            self._recorded = self.step
            self.state.log_history.append({**metrics, "step": self.step, "epoch": self.state.epoch})
            self.callbacks("on_log", logs=metrics)
            if control.should_save or (stopped and t.save_last):
                self.save(final_eval if last else None)
            if last:  # the last step, or a callback asked to stop
                break
        return final_eval

    def _step_end(self, metrics: dict[str, float]):
        """The callbacks' ``on_step_end``, with ``control.should_evaluate`` / ``should_save`` first set when
        train.eval_every / train.save_every (or the last step) asks, as transformers' DefaultFlowCallback sets
        them before the user's callbacks: what they leave there is what the step does."""
        t, c = self.cfg.train, self.callbacks.control
        finished = self._finished()
        c.should_evaluate = c.should_evaluate or finished or bool(t.eval_every and self.step % t.eval_every == 0)
        c.should_save = (
            c.should_save or (finished and t.save_last) or bool(t.save_every and self.step % t.save_every == 0)
        )
        return self.callbacks("on_step_end", metrics=metrics)

    def train_step(self) -> dict[str, float]:
        """One step through the stages: rollout and rewards, token batch and log-probabilities, the
        update's inputs (algo/pipeline.py: every variant's glue), mu slices (an optimizer update each, or every
        train.accumulation_slices of them, an update then possibly spanning steps), metrics."""
        cfg, a = self.cfg, self.cfg.algo
        self._timer = timer = Timer(cuda_provider(self.device))
        stage = self._enter_stage()  # train.stages: the step's domains, lr, group size ... in force
        sb = self._scored_batch()  # 1-3. prompts, rollout, rewards (+ EDGE's guided error correction)
        self.engine.sleep_for_update()  # colocated vLLM frees its memory once every round is sampled
        settings = self._step_settings()
        with timer("update"):  # 5a. the log-probabilities the stages need, before any update (once a step)
            batch, logprobs = self.step_logprobs(sb, settings)
        inputs = update_inputs(settings, sb, batch, logprobs)  # 4.
        every = step_metrics.job_rows(sb, self.dist)  # every rank's rows: what the ranks' own figures cannot give
        for hook in self.on_inputs:
            hook(sb, inputs, every)
        extra: dict[str, float] = {}
        updates: list[dict[str, float]] = []  # the step's applied updates (none while its first accumulates)
        self._updating = True  # from here on the model is no longer the last finished step's
        with timer("update"):  # 5-6. loss, backward, optimizer: the stream of slices, k an update
            parts, applied = cfg.train.updates_per_batch, self.updates
            end = self.slices + a.num_iterations * parts  # the stream's place after this batch's slices
            # TRL's normalisers of a cut batch: its counts over every rank, once for all its slices
            counts = batch_counts(inputs, parts, self.dist)
            slices = (jp for _ in range(a.num_iterations) for jp in enumerate(update_slices(inputs, parts)))
            for j, part in slices:  # num_iterations passes over TRL's steps_per_generation slices
                if self._updates_done() or self._stop_before_update(applied):  # TRL's max_steps, a callback's stop
                    break
                upd = self._update(part, counts, settings, j)
                updates += [upd] if upd is not None else []
            self.round_left = end - self.slices  # what a checkpoint of this step says it left untrained
            if a.ref_refresh_every and (self.step + 1) % a.ref_refresh_every == 0:
                refresh_reference(self.ref_model, self.model, a.ref_mixup_alpha)  # a policy snapshot, or TR-DPO's mix
                self.ref_refreshed = (self.step + 1, a.ref_mixup_alpha == 1.0)  # what a checkpoint keeps of it
        extra.update(self.engine.after_update(self.model, self.step + 1))  # weight sync / snapshot
        if cfg.rollout.async_staleness:  # the age of the batch as trained: refills are the step's own policy's
            extra.update(staleness_metrics(sb.rollout, self.step))
        upd = step_metrics.step_update_metrics(updates)  # the mean over the step's updates (grad_norm/max ...)
        return self._step_metrics(sb, inputs, every, {**upd, **extra, **stage})  # 7. record

    def _update(self, part, counts, settings: StepSettings, index: int) -> dict[str, float] | None:
        """Backpropagate slice ``part`` (number ``index`` of its batch; ``counts``: the batch's,
        update_windows.batch_counts; slice number ``self.slices`` of the run) into the pending update; apply the
        update once it holds its window's slices (train.accumulation_slices, or fewer at an epoch's end:
        train.accumulation_epoch_steps; every slice by default) and return its metrics, else None."""
        cfg, t = self.cfg, self.cfg.train
        for state in self.stage_states:  # e.g. adaptive entropy: this update's coefficient
            part = state.before_update(part)
        window, ends = window_at(
            self.slices,
            t.accumulation_slices,
            t.accumulation_epoch_steps * t.updates_per_batch * cfg.algo.num_iterations,
        )
        counts = window_counts(counts, index, t.updates_per_batch, window)  # TRL's normalisers of a cut batch
        forwards = Forwards(
            temperature=self.loss_temperature,
            micro_batch_size=t.micro_batch_size,
            micro_batch_tokens=self.token_budget,
            packed=self.packed,
            prefix_tree=self.prefix_tree,
            router_aux=self.router_aux,
            autocast=self.autocast,
        )
        self.loss_stage(self.model, self.optimizer, part, self.pending, forwards, dist=self.dist, counts=counts)
        self.slices += 1
        if not ends:
            return None
        self.callbacks("on_pre_optimizer_step")  # the update's gradient is complete; the step follows
        upd = apply_update(
            self.optimizer, self.scheduler, self.pending, cfg.optim, dist=self.dist, router_aux=self.router_aux
        )
        self.pending, self.updates = Accumulator(), self.updates + 1
        for state in self.stage_states:  # e.g. lambda-GRPO's own step, on the same gradient
            upd = {**upd, **state.after_update(upd, self.dist)}
        self.callbacks("on_optimizer_step", metrics=upd)  # once per update: grpokit.trl counts TRL's steps
        # transformers' order: the gradient is released after on_optimizer_step, so the next rollout and
        # reward phases do not hold a parameter-sized buffer (0.9 GB of a 0.5B model's rollout peak)
        self.optimizer.zero_grad(set_to_none=True)
        return upd

    def _stop_before_update(self, applied: int) -> bool:
        """Before an update's first slice: the callbacks' ``on_update_begin``; True when a callback asked to
        stop after one of this step's updates (``applied`` updates were done before the step), so the run
        ends between two updates, where TRL's ends (grpokit.trl closes a TRL step there)."""
        if self.pending.slices:  # the update began with an earlier slice
            return False
        return self.callbacks("on_update_begin").should_training_stop and self.updates > applied

    def _updates_done(self) -> bool:
        """train.max_updates reached (TRL's max_steps, which may fall inside a step's batch)."""
        return 0 < self.cfg.train.max_updates <= self.updates

    def _finished(self) -> bool:
        """train.steps done, or train.max_updates reached."""
        return self.step >= self.cfg.train.steps or self._updates_done()

    def _guarded_step(self) -> dict[str, float]:
        """``train_step``, with a fault before the step's update (a reward failing on most of a batch,
        a dead rollout server, a fault of grpokit's own code) first saving the last finished step, so
        the run stops with a checkpoint to resume from, not only the last ``save_every`` one. The
        random states and data position go back to where the step began: resuming from that
        checkpoint is the uninterrupted run. One process only (other ranks may not have failed)."""
        begun = checkpoint.rng_state(self.generator), self.sampler.state_dict()
        self._updating, self._in_step = False, True
        try:
            with noise_on(self.model):  # NEFTune (model.neftune_noise_alpha): the whole training step, as TRL
                return self.train_step()
        except StepAbandoned:  # a stop cut the step before its update: as if it never began
            checkpoint.set_rng_state(begun[0], self.generator)
            self.sampler.load_state_dict(begun[1])
            raise
        except Exception:
            self._in_step = False  # the save below is not the step: a stop must not cut it
            if not self._updating and self.step > self.saved_step and not self.dist.active:
                checkpoint.set_rng_state(begun[0], self.generator)
                self.sampler.load_state_dict(begun[1])
                try:
                    self.save()
                except Exception:  # noqa: BLE001 - a full disk now must not hide the fault being reported
                    pass
            raise
        finally:
            self._in_step = False

    def _scored_batch(self) -> ScoredBatch:
        """Stages 1-3: this rank's prompts, G completions each, scored (dynamic sampling, GFPO and
        EDGE-GRPO's guided error correction decide which groups and members stay)."""
        cfg, a, r = self.cfg, self.cfg.algo, self.cfg.rollout
        sb = collect(
            self.sample_and_score,
            cfg.train.prompts_per_step // self.dist.world_size,
            r.group_size,
            dynamic_sampling=a.dynamic_sampling,
            judged=self.judged,
            max_rounds=a.max_sampling_rounds,
            sample_group_size=r.sample_group_size,
            gfpo_criterion=r.gfpo_criterion,
            gfpo_adaptive=r.gfpo_adaptive,
            adaptive_threshold=r.gfpo_adaptive_threshold,
            dist=self.dist,
            warn=self._warn_once,
        )
        if a.error_correction != "off":  # EDGE-GRPO guided error correction: all-wrong groups get a corrected member
            sb = gec.correct(
                sb,
                self.tokenizer,
                self.runner,
                mode=a.error_correction,
                render=self.gec_render,
                reflection=a.error_correction_prompt,
                max_reward=a.error_correction_max_reward,
                judged=self.judged,
                eos_id=self.tokenizer.eos_token_id if isinstance(self.tokenizer.eos_token_id, int) else min(self.eos),
            )
        return sb

    def _step_settings(self) -> StepSettings:
        """The algorithm settings record of this run for algo/pipeline.py."""
        cfg, a = self.cfg, self.cfg.algo
        r = cfg.rollout
        return StepSettings(
            algo=a,
            component_weights=tuple(self.runner_weights) if cfg.reward.normalize_components else None,
            process_fn=self.process_fn,
            norm_constant=a.norm_constant or r.max_new_tokens,
            dist=self.dist,
            lam=self.stage_state("lambda_grpo"),
            mismatch=MismatchSettings(mode=r.mismatch_mask, low=r.mismatch_low, high=r.mismatch_high),
            tis=TISSettings(cap=r.tis_cap if engines.uses_tis(cfg) else 0.0, mode=r.tis_mode, floor=r.tis_min),
            sampler_truncates=self.replays_support,
            end_ids=end_ids(self.eos, self.tokenizer.pad_token_id),
            stale_slices=stale_slices(cfg.train.updates_per_batch, a.num_iterations, cfg.train.accumulation_slices),
        )

    def _step_metrics(
        self, sb: ScoredBatch, inputs, rows: step_metrics.JobRows, update_metrics: dict[str, float]
    ) -> dict[str, float]:
        """Stage 7: the step's metrics (rewards, advantages, update, lengths, health signatures,
        timings; ``rows``: every rank's rows of the step's batch), one line for the job (each metric by its
        rule over ranks, record/rank_reduction.py); sample
        rows every ``record.samples_every`` steps."""
        if self.recorder.wants_samples(self.step + 1):
            r = self.cfg.record
            samples = step_metrics.logged_samples(
                sb, inputs, r.samples_prompts, self.run_dir, self.step + 1, r.samples_images
            )
            self.recorder.log_samples(self.step + 1, samples)
        metrics = step_metrics.step_metrics(
            sb,
            inputs,
            update_metrics,
            self._timer,
            self.cfg.health.same_length_min_tokens,
            self.sampler.position,
            rows,
        )
        # per domain (over every rank's groups); a curriculum's own
        metrics.update({**step_metrics.domain_metrics(rows, sb, self.domain_graders), **self.sampler.metrics()})
        return distributed.reduce_metrics(self.dist, metrics, step_metrics.rank_weights(sb))

    # ------------------------------------------------------------------ helpers

    def _observe_sampled(self, sb: ScoredBatch) -> None:
        """The prompt sampler sees every scored batch (a curriculum learns its pass rates from them, a pass judged
        by reward.judge)."""
        judged_N = sb.judged(self.judged)[0].tolist()
        self.sampler.observe(sb.prompts, sb.total_N.tolist(), sb.group_size, judged_N=judged_N)

    def _warn_once(self, message: str) -> None:
        """A stage's warning about the run, said once (by the main process) through the recorder, so it reaches
        the console, health.jsonl and the trackers with the step that raised it; its metrics count every step."""
        if message not in self._warned and self.dist.is_main:
            self._warned.add(message)
            self.recorder.warn(self.step + 1, message)

    def stage_state(self, key: str) -> StageState | None:
        """The stage state saved under ``key`` (``lambda_grpo``, ``entropy_control``), None when off."""
        return next((state for state in self.stage_states if state.key == key), None)


def train(cfg: Config, **kwargs: Any) -> dict[str, Any]:
    """Run GRPO with ``cfg``; keyword arguments go to ``Trainer``. Returns the summary."""
    return Trainer(cfg, **kwargs).train()


def _write_report(run_dir: Path) -> None:
    from grpokit.record.report import write_report

    write_report(run_dir)
