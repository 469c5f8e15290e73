"""The Trainer's construction, step by step in the order ``Trainer.__init__`` calls them: the run
folder and its lock, the processes, stages 1-3's inputs (data, rewards), the policy with its
optimizer and memory plan, the starting step (0 or the resumed checkpoint's), the records, and stage
2's engine. A mixin of ``Trainer`` (train/loop.py): the loop reads what these set on ``self``."""

from __future__ import annotations

import functools
import weakref
from datetime import datetime
from pathlib import Path
from typing import Callable

import torch

from grpokit.algo.stage_state import stage_states
from grpokit.config.base import ConfigError
from grpokit.data.prompt_length import check_prompt_lengths, completion_room
from grpokit.data.prompts import check_same_data, fingerprint
from grpokit.rollout.engine import RolloutEngine
from grpokit.rollout.sampling import sampling_params

from . import (
    build,
    carried_state,
    checkpoint,
    checkpoint_hooks,
    distributed,
    domain_setup,
    engines,
    memory_plan,
    numerics,
    run_checkpoints,
    world_check,
)
from . import resume as run_folder
from .models import quiet_transformers, resolve_device
from .prefix_tree import refusal as prefix_tree_refusal
from .stages import run_values
from .update import Accumulator
from .update_windows import resumed_counts, rounds_to_make


class TrainerSetup:
    @functools.cached_property
    def data_identity(self) -> dict:
        """The training prompts' fingerprint (data/prompts.py), once: each checkpoint keeps it, a resume compares."""
        return fingerprint(self.prompts)

    def _open_run_dir(self, resume: str | Path | None, start_if_no_checkpoint: bool) -> None:
        """The run folder (a new dated one, ``train.out`` or the resumed one), locked for one writer
        (run_lock.py) until the end of ``train()``."""
        cfg = self.cfg
        named = run_checkpoints.checkpoint_folder(Path(resume)) if resume else None  # <run>/checkpoints/step-N
        self.resume_dir = named[0] if named else Path(resume) if resume else None
        self.resume_at = named[1] if named else None  # that checkpoint exactly, not the newest
        self.run_dir = self.resume_dir or Path(
            cfg.train.out or run_folder.new_run_dir(f"runs/{datetime.now():%Y%m%d-%H%M%S}")
        )
        self.lock, resuming = run_folder.prepare_run_dir(
            self.run_dir,
            cfg.train.overwrite,
            self.resume_dir is not None,
            start_if_no_checkpoint and named is None,
            move_earlier=cfg.train.move_earlier_run,
        )
        # once: at the end of train(), or when dropped
        self._release_lock = weakref.finalize(self, self.lock.release)
        if self.resume_dir and not resuming:  # grpokit train --resume on a folder without a checkpoint: step 0
            self.resume_dir, cfg.train.out = None, str(self.run_dir)
        if self.resume_dir:  # before any model is loaded: another model would not continue this run
            run_folder.check_same_model(self.run_dir, cfg)
            run_folder.check_same_batches(self.run_dir, cfg)

    def _join_processes(self) -> None:
        """Threads and seeds, torchrun's process group (no-op for 1 process), this rank's device."""
        cfg, t = self.cfg, self.cfg.train
        build.prepare_process(t)
        quiet_transformers()
        self.dist = distributed.setup(fsdp=t.fsdp, timeout_s=t.dist_timeout_s)
        world_check.check_world(cfg, self.dist)
        self.device = distributed.rank_device(self.dist, resolve_device(cfg.model))
        r = cfg.rollout
        if r.async_staleness > 0 and r.async_workers > 0:  # a card this process lacks: refused before the folder
            engines.worker_device(r, self.device, self.dist.world_size)

    def _build_data(self, train_rows, eval_rows, tools, environment_factory, given_tokenizer) -> None:
        """Stages 1-2's inputs: the episode loop (tools, environments), training and held-out prompts."""
        inputs = build.build_inputs(
            self.cfg, self.tokenizer, train_rows, eval_rows, tools, environment_factory, given_tokenizer
        )
        self.episodes, self.prompts, self.eval_prompts = inputs.episodes, inputs.prompts, inputs.eval_prompts
        self.make_prompts = inputs.make_prompts  # every other caller's rows become prompts the same way

    def _build_rewards(self, reward_funcs: list[Callable] | None) -> None:
        """Stage 3: the training and evaluation reward runners, the weights, the process reward."""
        rewards = build.build_rewards(self.cfg, reward_funcs, self.episodes)
        self.runner, self.eval_runner = rewards.runner, rewards.eval_runner
        self.runner_weights, self.process_fn = rewards.weights, rewards.process_fn
        self.domain_eval = rewards.domain_eval  # data.domains: each domain's held-out verifier
        self.domain_graders = rewards.domain_graders  # ... and its column among the training rewards
        self.judged = rewards.judged  # reward.judge's columns (None: the reward as trained)

    def _build_policy(self, model) -> None:
        """The model and its reference, the optimizer and schedule, the variants' stage states, then
        the prompts checked against the model's context and the memory plan for the longest one."""
        cfg = self.cfg
        policy = build.build_policy(cfg, self.device, self.dist, self.tokenizer, model)
        self.model, self.ref_model, self.autocast, self.eos = (
            policy.model,
            policy.ref_model,
            policy.autocast,
            policy.eos,
        )
        self.router_aux = policy.router_aux  # MoE router loss weight in the update (0: none)
        self.ref_adapter = policy.ref_adapter  # LoRA from a trained adapter: that adapter is the reference
        why = prefix_tree_refusal(self.model) if cfg.train.packing == "prefix_tree" else None
        if why is not None:
            raise ConfigError(why)
        self.gec_render = build.error_correction_renderer(cfg)
        opt = build.build_optimizer(cfg, self.model)
        self.optimizer, self.scheduler = opt.optimizer, opt.scheduler
        # lambda-GRPO, adaptive entropy
        self.stage_states = stage_states(cfg.algo, (cfg.optim.adam_beta1, cfg.optim.adam_beta2))
        room = completion_room(cfg, max(run_values(cfg, "rollout.max_new_tokens")), self.episodes.multi_turn)
        self.prompts, self.eval_prompts, self.prompts_cut = check_prompt_lengths(
            cfg, self.model, self.prompts, self.eval_prompts, room
        )
        # checkpointing, reference offload, tokens per micro-batch
        longest_prompt = max((len(p.ids) for p in self.prompts), default=0)
        self.memory_plan, self.token_budget = memory_plan.apply_memory_plan(
            cfg, self.model, self.ref_model, self.device, self.dist, longest_prompt
        )

    def _place_run(self) -> None:
        """The rank's generator, the prompt sampler and the step: 0, or the resumed checkpoint's."""
        cfg, t = self.cfg, self.cfg.train
        self.generator = torch.Generator(device=self.device).manual_seed(distributed.rank_seed(t.seed, self.dist.rank))
        # the plain seeded order, the frontier curriculum, or domains mixed by share (train/domain_setup.py)
        self.sampler = domain_setup.make_sampler(cfg, self.prompts, cfg.rollout.group_size, self.dist.world_size)
        self.step = self.saved_step = 0
        # optimizer updates applied (TRL's global_step), slices trained (the next one's place in the stream of
        # update windows), and those of the last step's batch left untrained (train.max_updates or a stop inside it)
        self.updates = self.slices = self.round_left = 0
        self.resumed_from: Path | None = None  # the checkpoint folder a resumed run started from
        self.pending = Accumulator()  # the update being accumulated (train.accumulation_slices > 1: it may span steps)
        # the step whose end last refreshed the reference (0: never) and whether that was a plain copy of the policy:
        # kept, not derived from algo.ref_refresh_every, which a resume may change (test_resume_reference.py)
        self.ref_refreshed: tuple[int, bool] = (0, True)
        self.saved_numerics: dict | None = None  # what the resumed checkpoint's sums depended on (train/numerics.py)
        if self.resume_dir:
            self._resume()
            self._steps_to_max_updates()

    def _check_numerics(self) -> None:
        """What this run's sums depend on, recorded once everything that sets it is in place (an async worker
        takes some of the trainer's threads when the engine starts): each checkpoint keeps it, and a resume that
        computes differently says so once."""
        self.numerics = numerics.numerics(self.model)
        changed = numerics.differences(self.saved_numerics, self.numerics)
        if changed and self.dist.is_main:  # kernels, threads or torch differ: the same run, not bit for bit
            print(f"grpokit: warning: resuming from {self.resumed_from}: {changed}", flush=True)

    def _open_records(self) -> None:
        """The run folder's config (resumed: config_history.yaml too) and the metrics sinks."""
        resumed_at = self.step if self.resume_dir else None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:
            run_folder.write_config(self.run_dir, self.cfg, resumed_at)
        self.recorder = build.build_recorder(self.cfg, self.run_dir, self.dist, self.quiet, resumed_at)

    def _build_engine(self) -> None:
        """Stage 2's engine: the one sampling on the trainer's model, or vLLM / the async sampler."""
        cfg = self.cfg
        self.params = sampling_params(cfg.rollout)
        r = cfg.rollout
        if (r.async_workers or r.async_remote_workers) and (
            self.episodes.multi_turn or any(p.vision is not None for p in self.prompts[:1])
        ):
            raise ConfigError(
                "rollout.async_workers samples one-turn text completions, not episodes with tools or environments "
                "or image prompts; set rollout.async_workers=0 (the thread samples them)"
            )
        if self.dist.is_main:
            engines.warn_ratio_one(cfg)  # clip, GSPO, SAPO ... settings that one update per batch leaves inert
        # the hf engine first: an async sampler's thread, started by make_engine, samples through it, and the held-out
        # evaluations decode with it whatever samples the run (trainer_outputs.py)
        self.hf = engines.hf_engine(cfg, self.eos, self.tokenizer.pad_token_id, self._decode, self.generator)
        self.engine: RolloutEngine = engines.make_engine(
            cfg,
            self.model,
            self.step,
            self.params,
            self.device,
            self.dist,
            self.run_dir,
            self.hf,
            (self._sample_async, self.sampler.next_batch),
            self._async_state(),
            self.tokenizer,
        )  # vLLM / async, or hf
        # what a checkpoint keeps of the engine: the async sampler's in-flight batches (rollout/async_plan.py)
        self.engine_state = self.engine.state_dict if cfg.rollout.async_staleness > 0 else (lambda: None)

    def _async_state(self) -> dict | None:
        """The async sampler's state in the checkpoint resumed from (None: a fresh run, or none saved)."""
        if not (self.resumed_from and self.cfg.rollout.async_staleness > 0):
            return None
        return checkpoint.load_extra(self.resumed_from).get("async_rollout")

    def _resume(self) -> None:
        """Load the newest checkpoint that verifies against its manifest (or the one named, ``resume_at``):
        weights, optimizer, schedule, random states, step, data position, the stage states and a pending
        update (carried_state.py). Checkpoints after a named one are set aside (resume.set_aside_later)."""
        ckpt = self.resumed_from = run_checkpoints.pick(
            self.run_dir, model_only_ok=self.cfg.train.save_only_model, at=self.resume_at
        )
        state = checkpoint.load(
            ckpt,
            self.model,
            self.optimizer,
            self.scheduler,
            self.generator,
            rank=self.dist.rank,
            **checkpoint_hooks.checkpoint_loaders(self.model, self.dist, self.cfg.model),
        )
        check_same_data(state.data, self.data_identity, str(ckpt))  # before anything is set aside
        self.saved_numerics = state.numerics  # compared once the engine has set the threads (check_numerics)
        self.step, self.sampler.position = state.step, state.data_position
        if self.resume_at is not None and self.dist.is_main:  # once loaded: the later checkpoints kept aside
            run_folder.set_aside_later(self.run_dir, ckpt)
        carried_state.restore_sampler(ckpt, self.sampler)  # domains' credits, a curriculum's pass rates
        a = self.cfg.algo  # the reference algo.ref_refresh_every left: once the policy's weights are in place
        self.ref_refreshed = carried_state.restore_reference(
            ckpt, self.ref_model, self.model, state.step, a.ref_refresh_every, a.ref_mixup_alpha
        )
        self.saved_step = state.step
        t = self.cfg.train
        pending = carried_state.restore_extra(ckpt, self.stage_states, self.optimizer, t.accumulation_slices)
        if pending is not None:  # an update the checkpoint's window left accumulating
            self.pending = pending
        scheduled = self.scheduler.last_epoch if (ckpt / "optimizer.pt").is_file() else None  # older checkpoints
        self.updates, self.slices = resumed_counts(
            state.step, state.updates, state.slices, scheduled, t, self.cfg.algo.num_iterations
        )
        if state.round_left and self.dist.is_main:  # TRL's resume too samples a new batch (its buffer is not saved)
            print(
                f"grpokit: warning: {ckpt} was written between two updates of step {state.step}'s batch, "
                f"{state.round_left} of its slices untrained (train.max_updates or a stop there); the resumed run "
                f"goes on with step {state.step + 1}'s new batch, as TRL's resume does, so those slices are not "
                "trained as the uninterrupted run would train them",
                flush=True,
            )

    def _steps_to_max_updates(self) -> None:
        """grpokit.trl (``until_max_updates``): train.steps are the rounds that make train.max_updates (TRL's
        max_steps) updates from step 0; a resumed run whose checkpoint ended between two updates of a step's batch
        needs more, which train.steps becomes (saved with the run's config)."""
        t = self.cfg.train
        if not (self.until_max_updates and t.max_updates > self.updates):
            return
        per_round, epoch = t.updates_per_batch * self.cfg.algo.num_iterations, t.accumulation_epoch_steps
        needed = rounds_to_make(
            t.max_updates - self.updates, self.slices, per_round, t.accumulation_slices, epoch * per_round
        )
        t.steps = max(t.steps, self.step + needed)
