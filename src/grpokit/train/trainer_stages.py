"""Entering a stage of train.stages (train/stages.py): a mixin of ``Trainer`` (train/loop.py).

Each step asks ``_enter_stage`` first. When the step's stage differs from the one in force (the first
step, a stage boundary, the first step of a resumed run), the stage's settings are put in place: the
sampled domains, the rollout's group size, length and temperature, the learning rate (the schedule's
base rates scaled, so warm-up and decay go on over the whole run) and the reward weights; a setting the
stage leaves out is the run's own. What the run derives from those settings follows them: the reward
functions' derived parameters (overlong_penalty's window) are resolved again from the stage's config, and
the Dr. GRPO constant is read from it at each step. Nothing that is already in force is touched, so a resumed run's
optimizer keeps exactly the learning rate its checkpoint holds.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from grpokit.config.base import ConfigError
from grpokit.data.domain_sampler import DomainSampler
from grpokit.data.domains import DomainReward
from grpokit.rollout.sampling import sampling_params

from . import domain_setup, teacher
from .models import resolve_dtype
from .stages import Stage, parse_stages, put_rollout, stage_at, stage_weights


class TrainerStages:
    def _setup_stages(self) -> None:
        """The stages, the run's own values they override, and every stage's reward weights checked."""
        self.stages: list[Stage] = parse_stages(self.cfg)
        self._stage_index: int | None = None
        self._stage_base = copy.deepcopy(self.cfg)
        self._base_lrs = list(self.scheduler.base_lrs)
        self._base_weights = [s.weight for s in self.runner.specs]
        self._spec_domains = [s.fn.domain if isinstance(s.fn, DomainReward) else None for s in self.runner.specs]
        for i, stage in enumerate(self.stages):  # each stage's weights and reward functions checked now
            stage_weights(stage, self._spec_domains, self._base_weights)
            trial = copy.deepcopy(self.cfg)
            put_rollout(trial, self._stage_base, stage)
            try:
                domain_setup.follow_settings(trial, self.runner.specs)
            except ConfigError as e:
                raise ConfigError(f"train.stages[{i}]: {e}") from None
        # a teacher per stage (a domain's expert): each loaded once, checked like algo.distill_teacher
        self._teachers = {self.cfg.algo.distill_teacher: self.ref_model} if self.cfg.algo.distill_teacher else {}
        for i, stage in enumerate(self.stages):
            if stage.teacher and stage.teacher not in self._teachers:
                each = copy.deepcopy(self.cfg)
                each.algo.distill_teacher = stage.teacher
                dtype = resolve_dtype(each.model, self.device)
                field = f"train.stages[{i}].teacher"
                self._teachers[stage.teacher] = teacher.load_teacher(each, self.device, dtype, self.tokenizer, field)

    def _enter_stage(self) -> dict[str, float]:
        """The step's stage in force; ``{"stage": i, "stage/step": k}`` ({} without stages)."""
        if not self.stages:
            return {}
        i, k = stage_at(self.stages, self.step)
        if i != self._stage_index:
            self._apply_stage(self.stages[i])
            self._stage_index = i
        return {"stage": float(i), "stage/step": float(k)}

    def _apply_stage(self, stage: Stage) -> None:
        base, cfg = self._stage_base, self.cfg
        given = dict(stage.overrides)
        put_rollout(cfg, base, stage)
        self.params = sampling_params(cfg.rollout)
        if isinstance(self.sampler, DomainSampler):
            self.sampler.set_domains(list(stage.domains) if stage.domains is not None else None)
        weights = stage_weights(stage, self._spec_domains, self._base_weights)
        self._follow_rewards(weights)
        if self._teachers:
            self.ref_model = self._teachers[stage.teacher or cfg.algo.distill_teacher]
        lr = float(given.get("optim.lr", base.optim.lr))  # optim.lr itself stays: schedules read it (polynomial)
        self._set_lr(lr / base.optim.lr if base.optim.lr else 1.0)

    def _follow_rewards(self, weights: list[float]) -> None:
        """The reward functions as the stage's settings make them (every value derived from a setting a stage
        changes follows it: overlong_penalty's window, domain_setup.follow_settings), with the stage's
        ``weights``; a domain's held-out grader is its training column's function (domain_setup.domain_graders)."""
        specs = domain_setup.follow_settings(self.cfg, self.runner.specs)
        for f, (old, new) in enumerate(zip(self.runner.specs, specs)):
            if new.fn is not old.fn:  # set_function: where the new one runs (a worker, or here if unpicklable)
                self.runner.set_function(f, new.fn)
        self.runner.specs = [replace(s, weight=w) for s, w in zip(self.runner.specs, weights)]
        self.runner_weights = weights
        by_name = {s.name: s.fn for s in self.runner.specs}
        for domain, column in self.domain_graders.items():  # without domains the evaluator reads the runner
            fn, grader = by_name[column], self.domain_eval[domain]
            fn = fn.fn if isinstance(fn, DomainReward) else fn
            if fn is not grader.specs[0].fn:
                grader.set_function(0, fn)

    def _set_lr(self, scale: float) -> None:
        """The schedule's base rates become the run's times ``scale``; the rate in force moves with them
        (the schedule's factor at this step kept). Rates already in force are left as they are."""
        sched = self.scheduler
        new = [b * scale for b in self._base_lrs]
        if new == list(sched.base_lrs):
            return
        for group, old, lr in zip(self.optimizer.param_groups, sched.base_lrs, new):
            group["lr"] = lr * (group["lr"] / old) if old else lr
            group["initial_lr"] = lr
        sched.base_lrs = new
        sched._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # what get_last_lr() logs
