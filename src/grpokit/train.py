"""Stage 6, the loop: it calls the stages in pipeline order and holds no math.

    for each step:
        prompts   <- sampler.next_batch(P)                    1  data.py
        rollout   <- G completions per prompt                 2  rollout/hf.py
        rewards   <- reward functions, weighted              3  rewards/
        adv       <- group-relative advantages                4  advantages.py
        old, ref  <- logprobs before the first update         5  logprobs.py
        mu times:  policy_update (loss, backward, step)       5-6 loss.py, update.py
        record metrics, samples, checkpoints, evals           7  record/, checkpoint.py

``Trainer(cfg).train()`` returns the run summary; ``grpokit train`` is a thin wrapper around it.
"""

from __future__ import annotations

import json
import random
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from . import checkpoint
from .advantages import group_advantages
from .config import Config, ConfigError, save_yaml, to_dict, validate
from .data import PromptSampler, load_rows, to_prompts
from .evaluate import evaluate
from .logprobs import completion_logprobs, make_token_batch
from .models import eos_ids, frozen_copy, load_model, load_tokenizer, resolve_device, resolve_dtype
from .record import group_signatures, make_recorder, sample_rows
from .rewards.runner import RewardRunner
from .rewards.spec import RewardSpec, resolve_reward
from .rollout.hf import SamplingParams, generate
from .update import UpdateInputs, make_optimizer, policy_update


class Trainer:
    """One GRPO run. ``reward_funcs`` (Python callables in TRL's convention) extend or replace the
    configured ones; ``train_rows``/``eval_rows`` replace the configured data."""

    def __init__(self, cfg: Config, *, reward_funcs: list[Callable] | None = None, train_rows: list[dict] | None = None,
                 eval_rows: list[dict] | None = None, resume: str | Path | None = None, quiet: bool = False):
        self.cfg = validate(cfg)
        self.resume_dir = Path(resume) if resume else None
        self.run_dir = self.resume_dir or Path(cfg.train.out or f"runs/{datetime.now():%Y%m%d-%H%M%S}")
        t, m = cfg.train, cfg.model
        if t.threads:
            torch.set_num_threads(t.threads)
        torch.use_deterministic_algorithms(t.deterministic)
        _seed_everything(t.seed)

        _quiet_transformers()
        self.device = resolve_device(m)
        self.tokenizer = load_tokenizer(m)
        train_rows, eval_rows = self._rows(train_rows, eval_rows)
        self.prompts = to_prompts(train_rows, self.tokenizer, cfg.data)
        self.eval_prompts = to_prompts(eval_rows, self.tokenizer, cfg.data)
        self.runner = RewardRunner(self._reward_specs(reward_funcs), num_workers=cfg.reward.num_workers,
                                   timeout_s=cfg.reward.timeout_s, failure_value=cfg.reward.failure_value,
                                   max_failure_fraction=cfg.reward.max_failure_fraction)

        self.model = load_model(m, self.device, resolve_dtype(m, self.device))
        self.ref_model = frozen_copy(self.model) if cfg.algo.beta > 0 else None  # no reference when beta = 0
        self.eos = eos_ids(self.tokenizer, self.model)
        self.optimizer, self.scheduler = make_optimizer(self.model, cfg.optim, t.steps * cfg.algo.num_iterations)
        self.generator = torch.Generator(device=self.device).manual_seed(t.seed)
        self.sampler = PromptSampler(self.prompts, t.seed, cfg.data.shuffle)
        self.step = 0
        if self.resume_dir:
            ckpt = checkpoint.latest(self.run_dir / "checkpoints")
            if ckpt is None:
                raise ConfigError(f"--resume {str(self.run_dir)!r} has no complete checkpoint under checkpoints/; nothing to resume")
            state = checkpoint.load(ckpt, self.model, self.optimizer, self.scheduler, self.generator)
            self.step, self.sampler.position = state.step, state.data_position
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_yaml(cfg, self.run_dir / "config.yaml")
        r = cfg.record
        self.recorder = make_recorder(
            self.run_dir, [s for s in r.sinks if not (quiet and s == "console")], t.steps, to_dict(cfg), resume_step=self.step if self.resume_dir else None,
            samples_every=r.samples_every, samples_prompts=r.samples_prompts)
        self.params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                                     top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, min_p=cfg.rollout.min_p,
                                     stop=tuple(cfg.rollout.stop))

    # ------------------------------------------------------------------ the loop

    def train(self) -> dict[str, Any]:
        cfg, t = self.cfg, self.cfg.train
        summary = self._load_summary()
        try:
            if "eval_before" not in summary:
                summary["eval_before"] = self._evaluate()
                self._write_summary(summary)
            final_eval = None
            while self.step < t.steps:
                metrics = self.train_step()
                self.step += 1
                last = self.step == t.steps
                if last or (t.eval_every and self.step % t.eval_every == 0):
                    result = self._evaluate()
                    metrics.update({f"eval/{k}": v for k, v in result.items()})
                    final_eval = result if last else None
                self.recorder.log(metrics, self.step)  # one line per step, written before its checkpoint
                if last or (t.save_every and self.step % t.save_every == 0):
                    self.save()
            summary["eval_after"] = final_eval if final_eval is not None else self._evaluate()
            summary["steps"] = self.step
            self._write_summary(summary)
        finally:
            self.recorder.close()
            self.runner.close()
        if cfg.record.report:
            _write_report(self.run_dir)
        return summary

    def train_step(self) -> dict[str, float]:
        cfg, G, P = self.cfg, self.cfg.rollout.group_size, self.cfg.train.prompts_per_step
        timer = _Timer()

        prompts = self.sampler.next_batch(P)  # 1. prompts
        with timer("rollout"):  # 2. rollout
            self.model.eval()
            ro = generate(self.model, [p.ids for p in prompts], G, self.params, eos_token_ids=self.eos,
                          pad_token_id=self.tokenizer.pad_token_id, generator=self.generator, decode=self._decode)
        texts = [self._decode(c) for c in ro.completion_ids]
        with timer("reward"):  # 3. rewards
            columns = {k: [p.columns.get(k) for p in prompts for _ in range(G)] for k in prompts[0].columns}
            scored = self.runner.score([p.text for p in prompts for _ in range(G)], texts, ro.completion_ids, G, columns)
        a = cfg.algo  # 4. advantages
        adv_PG, adv_metrics = group_advantages(scored.total_N.view(P, G), baseline=a.baseline, scale=a.scale,
                                               std=a.std, eps=a.adv_eps)
        with timer("update"):  # 5-6. logprobs, loss, optimizer
            batch = make_token_batch(ro, self.tokenizer.pad_token_id, self.device)
            old_logp = self._logprobs(self.model, batch) if a.num_iterations > 1 else None
            ref_logp = self._logprobs(self.ref_model, batch) if self.ref_model is not None else None
            inputs = UpdateInputs(batch, adv_PG.flatten().to(self.device), batch.completion_mask, old_logp, ref_logp)
            for _ in range(a.num_iterations):
                upd = policy_update(self.model, self.optimizer, self.scheduler, inputs, a, cfg.optim,
                                    temperature=cfg.rollout.temperature, micro_batch_size=cfg.train.micro_batch_size,
                                    norm_constant=a.norm_constant or cfg.rollout.max_new_tokens)

        lengths = [len(c) for c in ro.completion_ids]  # 7. record
        if self.recorder.wants_samples(self.step + 1):
            per_func = {n: scored.rewards_NF[:, f].tolist() for f, n in enumerate(scored.names)}
            self.recorder.log_samples(self.step + 1, sample_rows(
                [p.text for p in prompts], texts, per_func, scored.total_N.tolist(), adv_PG.flatten().tolist(),
                lengths, ro.finish_reasons, G, max_prompts=cfg.record.samples_prompts))
        return {
            "reward": scored.total_N.mean().item(),
            "reward_std": scored.total_N.view(P, G).std(dim=1).mean().item(),
            **scored.metrics, **adv_metrics, **upd,
            "completions/mean_length": float(np.mean(lengths)), "completions/min_length": float(min(lengths)),
            "completions/max_length": float(max(lengths)),
            "completions/clipped_ratio": ro.finish_reasons.count("length") / len(lengths),
            **group_signatures(texts, lengths, G),
            **timer.metrics(), "tokens_per_second": sum(lengths) / max(timer.total(), 1e-9),
            "rollout/tokens_per_second": sum(lengths) / max(timer.spans.get("rollout", 0.0), 1e-9),
            "data/position": float(self.sampler.position),
        }

    # ------------------------------------------------------------------ helpers

    @torch.no_grad()
    def _logprobs(self, model, batch) -> torch.Tensor:
        model.eval()
        mbs = self.cfg.train.micro_batch_size or batch.input_ids.shape[0]
        parts = [completion_logprobs(model, batch.rows(slice(s, s + mbs)), temperature=self.cfg.rollout.temperature)[0]
                 for s in range(0, batch.input_ids.shape[0], mbs)]
        return torch.cat(parts)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _evaluate(self) -> dict[str, float]:
        if not self.eval_prompts:
            return {}
        return evaluate(self.model, self.tokenizer, self.eval_prompts, self.runner,
                        max_new_tokens=self.cfg.rollout.max_new_tokens, eos_token_ids=self.eos)

    def save(self) -> Path:
        state = checkpoint.TrainerState(step=self.step, data_position=self.sampler.position)
        return checkpoint.save(self.run_dir / "checkpoints", state, self.model, self.tokenizer, self.optimizer,
                               self.scheduler, self.generator, keep=self.cfg.train.keep_checkpoints)

    def _rows(self, train_rows, eval_rows) -> tuple[list[dict], list[dict]]:
        d = self.cfg.data
        if train_rows is None or eval_rows is None:
            task = None
            if d.task and not d.dataset:
                from .tasks import get_task

                task = get_task(d.task)
            if train_rows is None and not (task or d.dataset):
                raise ConfigError("data.task and data.dataset are both empty; set one (e.g. data.task=arithmetic or data.dataset=train.jsonl)")
            if train_rows is None:
                train_rows = task.train_rows(self.cfg.train.seed) if task else load_rows(d.dataset, d.split, d)
            if eval_rows is None:
                if d.eval_dataset:
                    eval_rows = load_rows(d.eval_dataset, d.eval_split, d)
                else:
                    eval_rows = task.eval_rows() if task else []
        return train_rows, eval_rows[: d.eval_size]

    def _reward_specs(self, extra: list[Callable] | None) -> list[RewardSpec]:
        names, weights = self.cfg.reward.functions, self.cfg.reward.weights or [1.0] * len(self.cfg.reward.functions)
        specs = []
        for name, w in zip(names, weights):
            if name == "task" and extra and not self.cfg.data.task:
                continue  # the default "task" reward makes no sense without a task: the passed functions replace it
            if name == "task":
                from .tasks import get_task

                if not self.cfg.data.task:
                    raise ConfigError("reward.functions names 'task' but data.task is empty; name a reward function instead")
                fn = get_task(self.cfg.data.task).reward
                specs.append(RewardSpec(fn=fn, name=getattr(fn, "__name__", "task"), weight=w))
            else:
                specs.append(RewardSpec(fn=resolve_reward(name), name=name.split(":")[-1], weight=w))
        if extra:
            specs += [RewardSpec(fn=f, name=getattr(f, "__name__", f"reward_{i}"), weight=1.0) for i, f in enumerate(extra)]
        if not specs:
            raise ConfigError("reward.functions is empty and no reward function was passed; name at least one (e.g. task)")
        return specs

    def _load_summary(self) -> dict[str, Any]:
        p = self.run_dir / "summary.json"
        return json.loads(p.read_text()) if self.resume_dir and p.exists() else {}

    def _write_summary(self, summary: dict[str, Any]) -> None:
        tmp = self.run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        tmp.replace(self.run_dir / "summary.json")


def train(cfg: Config, **kwargs: Any) -> dict[str, Any]:
    """Run GRPO with ``cfg``; keyword arguments go to ``Trainer``. Returns the summary."""
    return Trainer(cfg, **kwargs).train()


class _Timer:
    def __init__(self):
        self.spans: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def __call__(self, name: str):
        timer = self

        class _Span:
            def __enter__(self):
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                timer.spans[name] = timer.spans.get(name, 0.0) + time.perf_counter() - self.start

        return _Span()

    def total(self) -> float:
        return time.perf_counter() - self.t0

    def metrics(self) -> dict[str, float]:
        return {**{f"time/{k}": v for k, v in self.spans.items()}, "time/step": self.total()}


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _write_report(run_dir: Path) -> None:
    from .record.report import write_report

    write_report(run_dir)


def _quiet_transformers() -> None:
    """Our console shows progress; transformers' per-load progress bars would only add noise."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
