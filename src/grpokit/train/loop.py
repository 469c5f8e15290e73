"""Stage 6, the loop: it calls the stages in pipeline order and holds no math.

    for each step:
        prompts   <- sampler.next_batch(P)                    1  data.py
        rollout   <- G episodes per prompt (one turn, or tools) 2  rollout/episodes.py, hf.py, env/
        rewards   <- reward functions, weighted              3  rewards/
        adv       <- group-relative advantages                4  advantages.py
        old, ref  <- logprobs before the first update         5  logprobs.py
        mu times:  policy_update (loss, backward, step)       5-6 loss.py, update.py
        record metrics, samples, checkpoints, evals           7  record/, checkpoint.py

``Trainer(cfg).train()`` returns the run summary; ``grpokit train`` is a thin wrapper around it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from . import checkpoint
from .callbacks import Callbacks, RunState
from grpokit.algo.advantages import entropy_scaled_advantages, group_advantages, kl_penalized_rewards, normalize_components, response_entropy
from grpokit.rollout.collect import ScoredBatch, collect
from grpokit.config.sections import Config, ConfigError
from grpokit.config.io import save_yaml, to_dict
from grpokit.config.validation import validate
from grpokit.data.prompts import PromptSampler, repeat_columns, to_prompts
from .evaluate import evaluate
from .logprobs import completion_logprobs, make_token_batch
from .models import eos_ids, frozen_copy, load_model, load_tokenizer, model_path, quiet_transformers, resolve_device, resolve_dtype
from grpokit.data.vision import check_engine, load_processor
from grpokit.record.vision_samples import with_images
from . import distributed, kernels, scaling, wiring
from grpokit.rollout import gec
from grpokit.record import NullRecorder, group_signatures, make_recorder, sample_rows, solved_signatures
from grpokit.rewards.runner import RewardRunner
from grpokit.rollout.episodes import episode_metrics
from grpokit.rollout.hf import SamplingParams, generate
from grpokit.algo.lambda_grpo import LearnableLambda
from grpokit.algo.loss import entropy_token_mask
from grpokit.types import Prompt
from .update import UpdateInputs, activation_memory_mb, make_optimizer, policy_update, token_budget


SMALL_MODEL = 20_000_000  # parameters; below this, train.threads=0 (auto) uses one CPU thread


class Trainer:
    """One GRPO run. ``reward_funcs`` (Python callables in TRL's convention) extend or replace the
    configured ones; ``train_rows``/``eval_rows`` replace the configured data. As in TRL's
    GRPOTrainer, ``tools`` (typed, documented functions) and ``environment_factory`` (a class with
    ``reset(**row)`` whose public methods are tools) make every sample a multi-turn episode
    (docs/AGENTS.md), and ``rollout_func(prompts, trainer) -> dict`` replaces stage 2 altogether.
    ``model`` / ``tokenizer`` (instantiated objects) replace loading ``model.name_or_path``;
    ``callbacks`` are called at the points listed in callbacks.py with ``args`` (default: ``cfg``)."""

    def __init__(self, cfg: Config, *, reward_funcs: list[Callable] | None = None, train_rows: list[dict] | None = None,
                 eval_rows: list[dict] | None = None, resume: str | Path | None = None, quiet: bool = False,
                 tools: list[Callable] | None = None, environment_factory: Callable | None = None,
                 rollout_func: Callable | None = None, model=None, tokenizer=None, callbacks: list | None = None,
                 args: Any = None):
        # one's own data replaces the task; the demo fills what nobody set; "demo" becomes the task's checkpoint
        self.cfg = validate(wiring.resolve_run(cfg, own_rows=train_rows is not None))
        self.resume_dir = Path(resume) if resume else None
        self.run_dir = self.resume_dir or Path(cfg.train.out or wiring.new_run_dir(f"runs/{datetime.now():%Y%m%d-%H%M%S}"))
        t, m = cfg.train, cfg.model
        if t.threads:
            torch.set_num_threads(t.threads)
        if t.deterministic:  # cuBLAS refuses deterministic mode without a fixed workspace (read at its first use)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(t.deterministic)
        _seed_everything(t.seed)

        quiet_transformers()
        self.dist = distributed.setup(fsdp=t.fsdp)  # torchrun: join the process group (no-op for 1 process)
        scaling.check_world(cfg, self.dist)
        self.device = distributed.rank_device(self.dist, resolve_device(m))
        self.tokenizer = load_tokenizer(m, tokenizer)
        self.processor = load_processor(model_path(m.name_or_path), tokenizer, m.trust_remote_code)  # None: text model
        train_rows, eval_rows = wiring.data_rows(cfg, train_rows, eval_rows)
        wiring.check_gold_answers(cfg, train_rows)
        self.episodes = wiring.episode_runner(cfg, self.tokenizer, tools, environment_factory, wiring._task(cfg))
        self.rollout_func = rollout_func
        schemas = self.episodes.schemas or None  # chat templates show the tools in the prompt
        self.prompts = to_prompts(train_rows, self.tokenizer, cfg.data, schemas, self.processor)
        self.eval_prompts = to_prompts(eval_rows, self.tokenizer, cfg.data, schemas, self.processor)
        check_engine(cfg.rollout.backend, self.prompts)
        specs = wiring.reward_specs(cfg, reward_funcs, self.episodes.factory)
        self.runner_weights = [sp.weight for sp in specs]
        self.process_fn = wiring.process_function(cfg) if cfg.algo.supervision == "process" else None
        self.runner = RewardRunner(specs, num_workers=cfg.reward.num_workers,
                                   timeout_s=cfg.reward.timeout_s, failure_value=cfg.reward.failure_value,
                                   max_failure_fraction=cfg.reward.max_failure_fraction)

        self.eval_runner = wiring.eval_runner(cfg, self.runner)
        self.model = load_model(m, self.device, resolve_dtype(m, self.device), model)
        if not t.threads and self.device.type == "cpu" and sum(p.numel() for p in self.model.parameters()) < SMALL_MODEL:
            torch.set_num_threads(1)  # auto: tiny matmuls are overhead-bound; threads only add contention
        if kernels.wants_onednn(m.cpu_matmul, self.device):  # float32 linears through oneDNN (kernels.py)
            kernels.use_onednn_linears(self.model)
        # no reference when beta = 0; with LoRA the reference is the base with adapters disabled (no copy)
        self.ref_model = frozen_copy(self.model) if cfg.algo.beta > 0 and not m.lora_rank else None
        self.autocast = scaling.autocast_factory(m, self.device, self.model)
        self.dist.broadcast_params(self.model)
        if t.fsdp:
            distributed.fully_shard_model(self.model)
        self.eos = eos_ids(self.tokenizer, self.model)
        self.gec_render = gec.resolve_renderer(cfg.algo.error_correction_fn) if cfg.algo.error_correction != "off" else None
        self.token_budget = 0 if t.fsdp else token_budget(  # tokens per micro-batch of the update (0: no cap)
            self.model.config, activation_memory_mb(t.activation_memory_mb, self.device),
            next(self.model.parameters()).element_size(), t.micro_batch_tokens)
        self.optimizer, self.scheduler = make_optimizer(self.model, cfg.optim, t.steps * cfg.algo.num_iterations)
        a = cfg.algo  # lambda-GRPO: a learnable lambda with its own optimizer (lambda_grpo.py)
        self.lam = LearnableLambda(a.lambda_init, a.lambda_lr, a.lambda_r, (cfg.optim.adam_beta1, cfg.optim.adam_beta2)) \
            if a.aggregation == "lambda-grpo" else None
        self.generator = torch.Generator(device=self.device).manual_seed(distributed.rank_seed(t.seed, self.dist.rank))
        self.sampler = PromptSampler(self.prompts, t.seed, cfg.data.shuffle)
        self.step = self.saved_step = 0
        if self.resume_dir:
            ckpt = checkpoint.latest(self.run_dir / "checkpoints")
            if ckpt is None:
                raise ConfigError(f"--resume {str(self.run_dir)!r} has no complete checkpoint under checkpoints/; nothing to resume")
            state = checkpoint.load(ckpt, self.model, self.optimizer, self.scheduler, self.generator, rank=self.dist.rank,
                                    **scaling.checkpoint_loaders(self))
            self.step, self.sampler.position = state.step, state.data_position
            self.saved_step = state.step
            if self.lam is not None:  # lambda-GRPO: lambda and its Adam moments continue where they were
                extra = checkpoint.load_extra(ckpt)
                if "lambda_grpo" not in extra:
                    raise ConfigError(f"checkpoint {str(ckpt)!r} holds no lambda-GRPO state (it was written without algo.aggregation=lambda-grpo); resume with the run's own config")
                self.lam.load_state_dict(extra["lambda_grpo"])
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:
            save_yaml(cfg, self.run_dir / "config.yaml")
        r = cfg.record
        self.recorder = NullRecorder() if not self.dist.is_main else make_recorder(
            self.run_dir, [s for s in r.sinks if not (quiet and s == "console")], t.steps, to_dict(cfg),
            health=cfg.health, resume_step=self.step if self.resume_dir else None,
            samples_every=r.samples_every, samples_prompts=r.samples_prompts, console_every=r.console_every)
        self.params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                                     top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, min_p=cfg.rollout.min_p,
                                     stop=tuple(cfg.rollout.stop), repetition_penalty=cfg.rollout.repetition_penalty)
        self.engine = scaling.make_engine(self)  # vLLM / async sampler, or None for the plain hf loop
        self.state = RunState(global_step=self.step, max_steps=t.steps, is_world_process_zero=self.dist.is_main)
        self.callbacks = Callbacks(callbacks, cfg if args is None else args, self.state, model=self.model,
                                   processing_class=self.tokenizer, optimizer=self.optimizer, lr_scheduler=self.scheduler)

    # ------------------------------------------------------------------ the loop

    def train(self) -> dict[str, Any]:
        cfg, t = self.cfg, self.cfg.train
        summary = self._load_summary()
        stop = wiring.GracefulStop(enabled=not self.dist.active)  # Ctrl-C: finish the step, then checkpoint
        try:
            stop.install()
            self.callbacks("on_train_begin")
            if "eval_before" not in summary:
                summary["eval_before"] = self._evaluate()
                self._write_summary(summary) if self.dist.is_main else None
            final_eval = None
            while self.step < t.steps and not stop.requested:
                self.callbacks("on_step_begin")
                metrics = self.train_step()
                self.step = self.state.global_step = self.step + 1
                self.state.epoch = self.sampler.position / len(self.prompts)
                last = self.callbacks("on_step_end").should_training_stop or self.step == t.steps
                if last or (t.eval_every and self.step % t.eval_every == 0):
                    result = self._evaluate()
                    metrics.update({f"eval/{k}": v for k, v in result.items()})
                    final_eval = result if last else None
                self.recorder.log(metrics, self.step)  # one line per step, written before its checkpoint
                self.state.log_history.append({**metrics, "step": self.step, "epoch": self.state.epoch})
                self.callbacks("on_log", logs=metrics)
                if last or (t.save_every and self.step % t.save_every == 0):
                    self.save(final_eval if last else None)
                if last:  # the last step, or a callback asked to stop
                    break
            interrupted = stop.requested and self.step < t.steps  # Ctrl-C: keep what was trained, no final evaluation
            if interrupted and self.step > self.saved_step:
                self.save()
            summary.pop("interrupted", None)
            if interrupted:
                summary["interrupted"] = True
            else:
                summary["eval_after"] = final_eval if final_eval is not None else self._evaluate()
            summary["steps"] = self.step
            self._write_summary(summary) if self.dist.is_main else None
            self.callbacks("on_train_end")
        finally:
            stop.uninstall()
            self.recorder.close()
            self.runner.close()
            self.eval_runner.close()
            if self.engine is not None:
                self.engine.close()
        if cfg.record.report and self.dist.is_main:
            _write_report(self.run_dir)
        return summary

    def train_step(self) -> dict[str, float]:
        cfg, a, r = self.cfg, self.cfg.algo, self.cfg.rollout
        G = r.group_size
        self._timer = timer = wiring.Timer()

        sb = collect(self._sample, cfg.train.prompts_per_step // self.dist.world_size, G,  # 1-3. prompts, rollout, rewards
                     dynamic_sampling=a.dynamic_sampling, max_rounds=a.max_sampling_rounds,
                     sample_group_size=r.sample_group_size, gfpo_criterion=r.gfpo_criterion,
                     gfpo_adaptive=r.gfpo_adaptive, adaptive_threshold=r.gfpo_adaptive_threshold, dist=self.dist)
        if a.error_correction != "off":  # EDGE-GRPO guided error correction: all-wrong groups get a corrected member
            sb = gec.correct(sb, self.tokenizer, self.runner, mode=a.error_correction, render=self.gec_render,
                             reflection=a.error_correction_prompt, max_reward=a.error_correction_max_reward,
                             eos_id=self.tokenizer.eos_token_id if isinstance(self.tokenizer.eos_token_id, int) else min(self.eos))
        P, ro = len(sb.prompts), sb.rollout
        with timer("update"):
            batch = make_token_batch(ro, self.tokenizer.pad_token_id, self.device)
            want_entropy = a.entropy_top_fraction < 1 or a.entropy_advantage or a.entropy_shaping != "none"
            need_old = a.num_iterations > 1 or want_entropy or a.kl_placement == "reward" or scaling.uses_tis(cfg)
            old_logp, entropy = self._logprobs(self.model, batch, entropy=want_entropy) if need_old else (None, None)
            ref_logp = scaling.reference_logprobs(self, batch) if a.beta > 0 else None

        rewards_N, extra = sb.total_N, {}  # 4. advantages
        if cfg.reward.normalize_components:  # MO-GRPO: each component normalised within its group
            w = torch.tensor(self.runner_weights)
            rewards_N = normalize_components(sb.rewards_NF.view(P, G, -1), w, std=a.std, eps=a.adv_eps).flatten()
        if a.kl_placement == "reward" and ref_logp is not None:  # PPO / REINFORCE++: KL in the reward
            rewards_N, kl_N = kl_penalized_rewards(rewards_N, old_logp.cpu(), ref_logp.cpu(), batch.completion_mask.cpu(), a.beta,
                                                   a.kl_estimator, a.kl_clamp or None)
            extra["kl"] = (kl_N.sum() / batch.completion_mask.sum().clamp(min=1).cpu()).item()
        if a.supervision == "process":  # DeepSeekMath process supervision: per-token advantages
            advantages, adv_metrics = wiring.step_advantages(self.process_fn, sb, batch.width, a.std, a.adv_eps)
        elif a.credit != "outcome":  # GiGPO / GAGPO: step-level credit across the turns of episodes
            advantages, adv_metrics = wiring.credit_advantages(sb, a, rewards_N, batch.completion_mask)
        elif a.entropy_shaping != "none":  # GTPO / GRPO-S: entropy-shaped rewards (arXiv 2508.04349)
            advantages, adv_metrics = wiring.shaped_advantages(a, rewards_N, entropy, batch.completion_mask, G, self.dist)
        else:
            rewards_all = self.dist.gather_rows(rewards_N)  # data parallel: batch-wide statistics see every rank
            lengths = self.dist.gather_rows(batch.completion_mask.sum(dim=1).cpu()).view(-1, G) if a.scale == "token_whiten" else None
            adv_PG, adv_metrics = group_advantages(rewards_all.view(-1, G), baseline=a.baseline, scale=a.scale, std=a.std,
                                                   eps=a.adv_eps, lengths_PG=lengths)  # REINFORCE++-baseline weighs by length
            advantages = self.dist.local_rows(adv_PG).flatten()
        if a.entropy_advantage:  # EDGE-GRPO: entropy-driven advantage, batch-wide mean entropy
            ent_N = response_entropy(entropy.float().cpu(), batch.completion_mask.float().cpu())
            advantages, eda_metrics = entropy_scaled_advantages(advantages, ent_N, self.dist.gather_rows(ent_N).mean(),
                                                                a.entropy_advantage_max_scale or None)
            extra.update(eda_metrics)
        if scaling.uses_tis(cfg):  # TIS: the sampler was not exactly pi_old (vLLM numerics, stale weights)
            advantages, tis_metrics = scaling.tis_advantages(advantages, old_logp, ro, batch, r.tis_cap)
            extra.update(tis_metrics)

        loss_mask = batch.completion_mask
        if a.mask_truncated:  # DAPO overlong filtering: truncated completions leave the loss
            keep = torch.tensor([f not in ("length", "turns") for f in ro.finish_reasons], dtype=loss_mask.dtype, device=self.device)
            loss_mask = loss_mask * keep[:, None]
        if a.entropy_top_fraction < 1:  # train only on the high-entropy "forking" tokens
            pool = self.dist.gather_varlen(entropy[loss_mask.bool()]) if self.dist.active else None  # global quantile
            loss_mask = entropy_token_mask(entropy, loss_mask, a.entropy_top_fraction, pool=pool)
        with timer("update"):  # 5-6. loss, backward, optimizer, mu times
            inputs = UpdateInputs(batch, advantages.to(self.device), loss_mask, old_logp,
                                  ref_logp if a.kl_placement == "loss" else None,
                                  wiring.turn_ids(ro, batch.width).to(self.device) if a.ratio_level == "turn" else None,
                                  self.lam.weight_fn(batch.completion_mask.sum(dim=1), G) if self.lam else None)
            algo = a if a.kl_placement == "loss" else dataclasses.replace(a, beta=0.0)
            for _ in range(a.num_iterations):
                if self.lam is not None:
                    self.lam.zero_grad()
                upd = policy_update(self.model, self.optimizer, self.scheduler, inputs, algo, cfg.optim,
                                    temperature=r.temperature, micro_batch_size=cfg.train.micro_batch_size,
                                    norm_constant=a.norm_constant or r.max_new_tokens, dist=self.dist,
                                    autocast=self.autocast,
                                    micro_batch_tokens=self.token_budget)
                if self.lam is not None:  # lambda-GRPO: lambda's own step on the same loss's gradient
                    extra.update(self.lam.step(self.dist))
            if a.ref_refresh_every and (self.step + 1) % a.ref_refresh_every == 0:
                self.ref_model.load_state_dict(self.model.state_dict())  # reference refresh: policy snapshot

        if self.engine is not None:
            extra.update(self.engine.after_update(self.model, self.step + 1))  # weight sync / snapshot
        lengths = ro.model_lengths()  # 7. record (an episode's length counts the model's tokens, as TRL)
        seq_adv = advantages if advantages.dim() == 1 else advantages.mean(dim=1)
        if self.recorder.wants_samples(self.step + 1):
            per_func = {n: sb.rewards_NF[:, f].tolist() for f, n in enumerate(sb.names)}
            self.recorder.log_samples(self.step + 1, with_images(wiring.add_logged_columns(sample_rows(
                [p.text for p in sb.prompts], sb.texts, per_func, sb.total_N.tolist(), seq_adv.tolist(),
                lengths, ro.finish_reasons, G, max_prompts=cfg.record.samples_prompts,
                messages=[e.messages for e in ro.episodes] if ro.episodes else None), sb.extra, G),
                sb.prompts, self.run_dir, self.step + 1))  # image prompts: PNGs with boxes drawn, for the report
        return distributed.reduce_metrics(self.dist, {
            **sb.metrics, **episode_metrics(ro), "reward": sb.total_N.mean().item(),
            "reward_std": sb.total_N.view(P, G).std(dim=1).mean().item(),
            **adv_metrics, **upd, **extra,
            "completions/mean_length": float(np.mean(lengths)), "completions/min_length": float(min(lengths)),
            "completions/max_length": float(max(lengths)),
            "completions/clipped_ratio": ro.finish_reasons.count("length") / len(lengths),
            **group_signatures(sb.texts, lengths, G, ro.finish_reasons, cfg.health.same_length_min_tokens),
            **solved_signatures(sb.texts, sb.total_N.tolist(), G),  # lets the monitors tell convergence from collapse
            **timer.metrics(), "tokens_per_second": sum(lengths) / max(timer.total(), 1e-9),
            "rollout/tokens_per_second": sum(lengths) / max(timer.spans.get("rollout", 0.0), 1e-9),
            "data/position": float(self.sampler.position),
        })

    def _sample(self, prompts: int | list[Prompt], group_size: int) -> ScoredBatch | None:
        """Sample ``group_size`` completions for n fresh prompts (or the given ones) and score them.
        An empty list (a rank with nothing to add while others sample) returns None."""
        ro = None
        if isinstance(prompts, int):  # this rank's slice of the step's prompts, or an async prefetch
            prompts, ro = scaling.next_prompts(self, prompts, group_size)
        extra: dict[str, list] = {}
        with self._timer("rollout"), self.autocast(), scaling.sampling_model(self) as model:  # FSDP: ranks in step
            self.model.eval()
            if ro is None and self.rollout_func is not None and prompts:  # TRL's rollout_func replaces stage 2
                ro, extra = wiring.call_rollout_func(self.rollout_func, self, prompts, group_size)
            if ro is None and prompts:  # the episode loop on vLLM (colocated or server) or on the model itself
                ro = self.episodes.run(self.turn_sampler(model), prompts, group_size, self.params)
                if self.engine is not None and hasattr(self.engine, "finish_sampling"):
                    self.engine.finish_sampling()  # colocated vLLM sleeps only once every turn is sampled
        if not prompts:
            return None
        texts = [self._decode(c) for c in ro.completion_ids]
        with self._timer("reward"):
            conv = self.cfg.reward.convention
            completions, env_columns = wiring.reward_inputs(ro, texts, [p for p in prompts for _ in range(group_size)], conv)
            columns = {**repeat_columns(prompts, group_size), **env_columns, **extra}
            scored = self.runner.score(wiring.reward_prompts(prompts, group_size, conv), completions, ro.completion_ids,
                                       group_size, columns, trainer_state=self.state.light())
        return ScoredBatch(prompts, ro, texts, scored.rewards_NF, scored.total_N, scored.names, scored.metrics, scored.extra)

    # ------------------------------------------------------------------ helpers

    def turn_sampler(self, model, generator: torch.Generator | None = None):
        """``(contexts, group_size, params) -> Rollout``: one batched decode of a turn, on the
        vLLM engine when there is one (and it samples synchronously), else on ``model``. CUDA
        graphs (rollout.cuda_graphs) only on the trainer's own thread: the async sampler (its own
        ``generator``) runs beside the update, where a graph capture must not happen."""
        engine = getattr(self, "engine", None)  # the async sampler's thread may start before it is set
        if engine is not None and not getattr(engine, "prefetches", False):
            return lambda ctx, G, params: engine.generate(ctx, G, params=params, sleep=False)
        return lambda ctx, G, params, **kw: generate(model, ctx, G, params, eos_token_ids=self.eos, decode=self._decode, **kw,
                                               pad_token_id=self.tokenizer.pad_token_id,
                                               generator=generator if generator is not None else self.generator,
                                               cuda_graphs=self.cfg.rollout.cuda_graphs and generator is None)

    @torch.no_grad()
    def _logprobs(self, model, batch, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """No-grad logprobs (and entropies) of the whole batch, micro-batch by micro-batch."""
        model.eval()
        mbs = self.cfg.train.micro_batch_size or batch.input_ids.shape[0]
        with self.autocast():
            parts = [completion_logprobs(model, batch.rows(slice(s, s + mbs)), temperature=self.cfg.rollout.temperature,
                                         with_entropy=entropy) for s in range(0, batch.input_ids.shape[0], mbs)]
        return torch.cat([p[0] for p in parts]), (torch.cat([p[1] for p in parts]) if entropy else None)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _evaluate(self) -> dict[str, float]:
        if not self.eval_prompts:
            return {}
        with scaling.sampling_model(self) as model:
            result = evaluate(model, self.tokenizer, self.eval_prompts, self.eval_runner,
                              max_new_tokens=self.cfg.rollout.max_new_tokens, eos_token_ids=self.eos, episodes=self.episodes,
                              convention=self.cfg.reward.convention)
        self.callbacks("on_evaluate", metrics={f"eval_{k}": v for k, v in result.items()})
        return result

    def save(self, final_eval: dict[str, float] | None = None) -> Path:
        state = checkpoint.TrainerState(step=self.step, data_position=self.sampler.position)
        hooks = scaling.checkpoint_writers(self)  # LoRA adapters, every rank's sampler state, FSDP gather
        path = self.run_dir / "checkpoints" / f"{checkpoint.PREFIX}{self.step:06d}"
        if self.dist.is_main:  # rank 0 writes; the others wait until the checkpoint is complete
            card = checkpoint.model_card(self.cfg, self.step, [s.name for s in self.runner.specs], final_eval)
            path = checkpoint.save(self.run_dir / "checkpoints", state, self.model, self.tokenizer, self.optimizer,
                                   self.scheduler, self.generator, keep=self.cfg.train.keep_checkpoints, card=card,
                                   extra_state={"lambda_grpo": self.lam.state_dict()} if self.lam else None, **hooks)
        self.dist.barrier()
        self.saved_step = self.step
        self.callbacks("on_save", checkpoint=path)
        return path

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


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _write_report(run_dir: Path) -> None:
    from grpokit.record.report import write_report

    write_report(run_dir)
