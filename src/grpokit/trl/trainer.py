"""A TRL GRPO script runs under grpokit by changing one import line.

    from grpokit.trl import GRPOConfig, GRPOTrainer      # instead of: from trl import GRPOConfig, GRPOTrainer

``GRPOTrainer`` takes TRL 1.16's constructor arguments, maps ``GRPOConfig`` onto grpokit's
``Config`` (grpokit/trl_mapping.py; the table is docs/TRL.md) and runs grpokit's ``Trainer``.
Reward functions receive what TRL's GRPOTrainer passes them: ``prompts`` as the dataset holds them
(chat messages for conversational data), conversational completions as
``[{"role": "assistant", "content": ...}]``, ``completion_ids``, every dataset column under its own
name, ``trainer_state``, ``log_metric`` and ``log_extra``. Text prompts are used as written (no chat
template), chat-message prompts go through the tokenizer's template, as in TRL.

Departures from TRL, each deliberate: reward functions are called once per group of G completions
(not once per batch); a reward function's failure on one completion is contained and counted, not a
crash; with an ``eval_dataset`` grpokit also evaluates (greedy, first reward function) before and
after training; checkpoints are ``output_dir/checkpoints/step-N`` with grpokit's run folder beside
them (metrics.jsonl, report.html). An argument grpokit cannot carry out is refused with one sentence.

``train()`` returns transformers' ``TrainOutput`` (``global_step``, ``training_loss``, ``metrics`` with
``train_runtime``, ``train_samples_per_second``, ``train_steps_per_second``, ``train_loss``, ``epoch``);
grpokit's held-out evaluations ride along in ``metrics`` as ``eval_before/<name>`` and
``eval_after/<name>``, and the whole run summary (summary.json) is ``trainer.summary``. A grpokit step
samples once and makes ``num_iterations`` updates, so ``global_step`` counts sampling steps, as
``trainer.state.global_step`` does. ``trainer.accelerator`` answers what TRL's scripts ask of
accelerate's ``Accelerator`` (process index and count, ``print``, ``wait_for_everyone``), and
``trainer.end()`` leaves the process group, as transformers' ``Trainer.end``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from grpokit.train import distributed
from grpokit.config.sections import ConfigError
from grpokit.config.io import set_field
from .config import GRPOConfig
from .mapping import to_config

log = logging.getLogger("grpokit.trl")

__all__ = ["GRPOConfig", "GRPOTrainer", "TrainOutput"]

LORA_FIELDS = {"r": "model.lora_rank", "lora_alpha": "model.lora_alpha", "lora_dropout": "model.lora_dropout",
               "target_modules": "model.lora_target_modules"}
LORA_COSMETIC = {"task_type", "peft_type", "base_model_name_or_path", "revision", "inference_mode", "auto_mapping"}


class TrainOutput(NamedTuple):
    """What ``train()`` returns, as transformers' TrainOutput."""

    global_step: int
    training_loss: float
    metrics: dict[str, Any]


class GRPOTrainer:
    """TRL's GRPOTrainer on grpokit's loop; see the module docstring for what it passes and where it differs."""

    def __init__(self, model: Any, reward_funcs: Any = None, args: GRPOConfig | None = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, reward_processing_classes: Any = None,
                 callbacks: list | None = None, optimizers: tuple = (None, None), quantization_config: Any = None,
                 peft_config: Any = None, tools: list[Callable] | None = None, rollout_func: Callable | None = None,
                 environment_factory: Any = None):
        name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "") or "model"
        self.args = args if args is not None else GRPOConfig(f"{name.rstrip('/').split('/')[-1]}-GRPO")
        if not isinstance(self.args, GRPOConfig):
            raise ConfigError(f"args must be a grpokit.trl.GRPOConfig, got {type(self.args).__name__}; build it with the same arguments")
        for what, value in (("reward_processing_classes", reward_processing_classes), ("quantization_config", quantization_config)):
            if value is not None:
                raise ConfigError(f"GRPOTrainer argument {what} is not supported by grpokit; leave it None")
        if optimizers != (None, None):
            raise ConfigError("GRPOTrainer argument optimizers is not supported by grpokit (it builds AdamW from the GRPOConfig); leave it (None, None)")
        if isinstance(environment_factory, dict):
            raise ConfigError("GRPOTrainer argument environment_factory as a dict of environments is not supported by grpokit; pass one factory")
        if getattr(model, "peft_config", None) is not None and not isinstance(model, str):
            raise ConfigError("model is a PeftModel; pass the base model and the adapters' settings as peft_config")
        train_rows = _rows(train_dataset, "train_dataset", self.args.remove_unused_columns)
        eval_rows = _rows(eval_dataset, "eval_dataset", self.args.remove_unused_columns) if eval_dataset is not None else []
        funcs = _reward_funcs(reward_funcs)
        cfg = to_config(self.args, num_rows=len(train_rows))
        set_field(cfg, "model.name_or_path", name)
        set_field(cfg, "data.eval_size", len(eval_rows))
        if not isinstance(model, str) and str(getattr(model, "dtype", "")).replace("torch.", "") in ("float32", "bfloat16", "float16"):
            set_field(cfg, "model.dtype", str(model.dtype).replace("torch.", ""))  # an object keeps its dtype
        if peft_config is not None:
            _apply_lora(cfg, peft_config)
        if cfg.reward.weights and len(cfg.reward.weights) != len(funcs):
            raise ConfigError(f"reward_weights has {len(cfg.reward.weights)} entries but there are {len(funcs)} reward functions; "
                              "give one weight per reward function")
        if self.args.disable_dropout and not isinstance(model, str):
            _no_dropout(model)
        self.cfg, self.reward_funcs, self._callbacks = cfg, funcs, list(callbacks or [])
        self._kwargs = dict(reward_funcs=funcs, train_rows=train_rows, eval_rows=eval_rows, tools=tools,
                            environment_factory=environment_factory, rollout_func=rollout_func,
                            model=None if isinstance(model, str) else model, tokenizer=processing_class)
        self._trainer = None  # built on first use: a resumed run must not start fresh files first
        self.accelerator = Accelerator()
        self.summary: dict[str, Any] = {}
        """grpokit's run summary (eval_before, eval_after, steps), set by ``train()``."""

    def _get(self):
        if self._trainer is None:
            self._trainer = self._build(resume=None)
        return self._trainer

    def _build(self, resume):
        from grpokit.train.loop import Trainer

        callbacks = self._callbacks + ([_HubPush(self)] if self.args.push_to_hub and self.args.hub_strategy == "every_save" else [])
        trainer = Trainer(self.cfg, resume=resume, callbacks=callbacks, args=self.args, **self._kwargs)
        if self.args.disable_dropout:
            _no_dropout(trainer.model)
        return trainer

    # -- what TRL scripts read from the trainer
    model = property(lambda self: self._get().model)
    processing_class = property(lambda self: self._get().tokenizer)
    state = property(lambda self: self._get().state)
    run_dir = property(lambda self: Path(self.cfg.train.out))

    @property
    def hub_model_id(self) -> str:
        return self.args.hub_model_id or Path(self.cfg.train.out).name

    def add_callback(self, callback: Any) -> None:
        """Add a callback (an object or a class), as transformers' ``Trainer.add_callback``."""
        self._callbacks.append(callback)
        if self._trainer is not None:
            self._trainer.callbacks.callbacks.append(callback() if isinstance(callback, type) else callback)

    def train(self, resume_from_checkpoint: str | bool | None = None) -> TrainOutput:
        """Train; ``resume_from_checkpoint`` True (or the output_dir) continues from the latest checkpoint."""
        if resume_from_checkpoint:
            if self._kwargs["model"] is not None:
                raise ConfigError("resume_from_checkpoint needs the model passed as a name or path (an object cannot be reloaded)")
            if self._trainer is not None:
                raise ConfigError("resume_from_checkpoint must come with the trainer's first use (it was already started as a new run)")
            folder = self.cfg.train.out if resume_from_checkpoint is True else str(resume_from_checkpoint)
            if Path(folder).name.startswith("step-"):  # a checkpoint folder: its run folder resumes
                folder = str(Path(folder).parent.parent)
            self._trainer = self._build(resume=folder)
        trainer = self._get()
        start = time.perf_counter()
        self.summary = trainer.train()
        runtime = time.perf_counter() - start
        if self.args.push_to_hub:
            self.push_to_hub()
        losses = [h["loss"] for h in self.state.log_history if "loss" in h]
        per_step = self.cfg.train.prompts_per_step * self.cfg.rollout.group_size
        return train_output(self.state.global_step, self.state.epoch, losses, runtime, per_step, self.summary)

    def end(self) -> None:
        """Finish: leave the process group (transformers' ``Trainer.end``); trackers closed when training ended."""
        self.accelerator.end_training()

    def save_model(self, output_dir: str | None = None) -> Path:
        """Write the policy (the adapter with LoRA), its tokenizer and a model card to ``output_dir``
        (default: the GRPOConfig's), as TRL's ``save_model``."""
        from grpokit.train.checkpoint import model_card

        out = Path(output_dir or self.cfg.train.out)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out, safe_serialization=True)
        self.processing_class.save_pretrained(out)
        (out / "README.md").write_text(model_card(self.cfg, self.state.global_step, [s.name for s in self._get().runner.specs]))
        return out

    def push_to_hub(self, commit_message: str = "End of training", blocking: bool = True, token: str | None = None,
                    revision: str | None = None, **kwargs: Any) -> str:
        """Save the model to output_dir and upload it to ``hub_model_id`` (huggingface_hub; the endpoint
        is ``HF_ENDPOINT`` when set). Returns the commit URL."""
        return push_folder(self.save_model(), self.hub_model_id, commit_message, token or self.args.hub_token,
                           self.args.hub_private_repo, revision)


def train_output(global_step: int, epoch: float, losses: list[float], runtime: float, completions_per_step: int,
                 summary: dict[str, Any]) -> TrainOutput:
    """transformers' TrainOutput of a finished run: the mean logged loss, throughput over ``runtime``
    seconds (samples are completions sampled), and grpokit's evaluations flattened in as
    ``eval_before/<name>``, ``eval_after/<name>``."""
    loss = sum(losses) / len(losses) if losses else float("nan")
    seconds = max(runtime, 1e-9)
    metrics: dict[str, Any] = {"train_runtime": round(runtime, 4),
                               "train_samples_per_second": round(global_step * completions_per_step / seconds, 3),
                               "train_steps_per_second": round(global_step / seconds, 3), "train_loss": loss, "epoch": epoch}
    for when in ("eval_before", "eval_after"):
        metrics.update({f"{when}/{k}": v for k, v in (summary.get(when) or {}).items()})
    return TrainOutput(global_step, loss, metrics)


class Accelerator:
    """The part of accelerate's ``Accelerator`` TRL scripts use: where this process stands in the job
    (from torch.distributed once joined, else torchrun's RANK / LOCAL_RANK / WORLD_SIZE), a print on
    the main process only, a barrier, and the end of the process group."""

    process_index = property(lambda self: distributed.position()[0])
    num_processes = property(lambda self: distributed.position()[1])
    local_process_index = property(lambda self: distributed.position()[2])
    is_main_process = property(lambda self: self.process_index == 0)
    is_local_main_process = property(lambda self: self.local_process_index == 0)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self.is_local_main_process:
            print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def end_training(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def unwrap_model(self, model: Any, **kwargs: Any) -> Any:
        return model


HUB_TIMEOUT_S = float(os.environ.get("GRPOKIT_HUB_TIMEOUT_S", "900"))  # one push, all files; a silent endpoint hung forever


class HubPushError(RuntimeError):
    """An upload to the Hub failed or did not finish in time (one sentence)."""


def push_folder(folder: Path, repo_id: str, message: str, token: str | None, private: bool | None,
                revision: str | None = None, timeout_s: float | None = None) -> str:
    """Upload the files of ``folder`` (not its subfolders: checkpoints and run files stay local) as one
    commit, within ``timeout_s`` seconds (``GRPOKIT_HUB_TIMEOUT_S``, 900 by default); any failure is one
    ``HubPushError`` sentence. The upload runs in a daemon thread, so a silent endpoint costs the deadline,
    never the run."""
    timeout_s = HUB_TIMEOUT_S if timeout_s is None else timeout_s
    box: dict[str, Any] = {}

    def upload() -> None:
        try:
            box["url"] = _upload(folder, repo_id, message, token, private, revision)
        except BaseException as e:  # handed to the caller as one sentence
            box["error"] = e

    thread = threading.Thread(target=upload, name="grpokit-hub-push", daemon=True)
    thread.start()
    thread.join(timeout_s)
    where = os.environ.get("HF_ENDPOINT") or "the Hugging Face Hub"
    if thread.is_alive():
        raise HubPushError(f"push_to_hub of {folder} to {repo_id} at {where} did not finish within {timeout_s:g} s; "
                           "check the network or raise GRPOKIT_HUB_TIMEOUT_S (the model is saved locally)")
    if "error" in box:
        e = box["error"]
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise HubPushError(f"push_to_hub of {folder} to {repo_id} at {where} failed ({type(e).__name__}: {first}); "
                           "the model is saved locally") from None
    return box["url"]


def _upload(folder: Path, repo_id: str, message: str, token: str | None, private: bool | None, revision: str | None) -> str:
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    ops = [CommitOperationAdd(path_in_repo=p.name, path_or_fileobj=str(p)) for p in sorted(folder.iterdir()) if p.is_file()]
    return str(api.create_commit(repo_id, ops, commit_message=message, revision=revision).commit_url)


class _HubPush:
    """hub_strategy every_save: each checkpoint's model goes to the Hub when it is written. A failed
    push of a checkpoint is logged and training goes on (the checkpoint is on disk)."""

    def __init__(self, trainer: GRPOTrainer):
        self.trainer = trainer

    def on_save(self, args, state, control, checkpoint=None, **kwargs):
        if checkpoint is not None and state.is_world_process_zero:
            try:
                push_folder(Path(checkpoint) / "model", self.trainer.hub_model_id,
                            f"Training in progress, step {state.global_step}", args.hub_token, args.hub_private_repo)
            except HubPushError as e:
                log.warning("%s", e)


# ---------------------------------------------------------------- arguments


def _rows(dataset: Any, what: str, prompt_only: bool) -> list[dict]:
    """Rows of a ``datasets.Dataset`` (or a list of dicts), every column under its own name."""
    if dataset is None:
        raise ConfigError(f"{what} is None; pass a datasets.Dataset with a 'prompt' column")
    if type(dataset).__name__ in ("DatasetDict", "IterableDatasetDict", "dict"):
        raise ConfigError(f"{what} is a {type(dataset).__name__}; pass one split, e.g. dataset['train']")
    if type(dataset).__name__ == "IterableDataset":
        raise ConfigError(f"{what} is an IterableDataset; grpokit needs a datasets.Dataset (load it without streaming)")
    rows = [dict(r) for r in dataset]
    if not rows:
        raise ConfigError(f"{what} has no rows")
    if "prompt" not in rows[0]:
        raise ConfigError(f"{what} has no 'prompt' column (its columns: {', '.join(rows[0])}); rename the prompt column to 'prompt' as TRL needs")
    return [{"prompt": r["prompt"]} for r in rows] if prompt_only else rows


def _reward_funcs(funcs: Any) -> list[Callable]:
    """Callables as given; a string is a reward model (local folder or hub id), as TRL."""
    funcs = [] if funcs is None else funcs if isinstance(funcs, list) else [funcs]
    out = []
    for f in funcs:
        if isinstance(f, str):
            out.append(RewardModel(f))
        elif callable(f) and not hasattr(f, "parameters"):
            out.append(f)
        else:
            raise ConfigError(f"reward_funcs entry {f!r:.80} is not supported; pass functions or reward models as a folder or hub id")
    if not out:
        raise ConfigError("reward_funcs is empty; pass at least one reward function or reward model")
    return out


def _apply_lora(cfg, peft_config: Any) -> None:
    """A ``peft.LoraConfig`` onto model.lora_*; any other PEFT setting away from its default is refused."""
    from peft import LoraConfig

    if not isinstance(peft_config, LoraConfig):
        raise ConfigError(f"peft_config is a {type(peft_config).__name__}; grpokit trains LoRA adapters only (peft.LoraConfig)")
    default = LoraConfig()
    for f in dataclasses.fields(peft_config):
        if f.name in LORA_FIELDS or f.name in LORA_COSMETIC:
            continue
        value = getattr(peft_config, f.name)
        if value != getattr(default, f.name):
            raise ConfigError(f"peft_config.{f.name}={value!r} is not supported by grpokit; leave it at PEFT's default {getattr(default, f.name)!r}")
    targets = peft_config.target_modules
    targets = ["all-linear"] if targets is None or targets == "all-linear" else sorted(targets) if not isinstance(targets, str) else None
    if targets is None:
        raise ConfigError(f"peft_config.target_modules={peft_config.target_modules!r} is a regular expression; give a list of module names or 'all-linear'")
    set_field(cfg, "model.lora_rank", peft_config.r)
    set_field(cfg, "model.lora_alpha", peft_config.lora_alpha)
    set_field(cfg, "model.lora_dropout", peft_config.lora_dropout)
    set_field(cfg, "model.lora_target_modules", targets)


def _no_dropout(model) -> None:
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


class RewardModel:
    """A sequence-classification reward model given by folder or hub id, scoring as TRL does: the
    reward tokenizer's chat template over prompt + completion messages for conversational data,
    ``prompt + completion`` otherwise; the reward is the first logit."""

    def __init__(self, path: str):
        from grpokit.rewards.models import SequenceClassifierReward

        self.scorer = SequenceClassifierReward(path)
        self.__name__ = path.rstrip("/").split("/")[-1]

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        tok = self.scorer.tokenizer
        if prompts and isinstance(prompts[0], list) and getattr(tok, "chat_template", None):
            texts = [tok.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
        else:
            from grpokit.rewards.math import completion_text

            texts = [("\n".join(m["content"] for m in p) if isinstance(p, list) else p) + completion_text(c)
                     for p, c in zip(prompts, completions)]
        return self.scorer([""] * len(texts), texts)
