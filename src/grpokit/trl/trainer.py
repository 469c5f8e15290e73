"""A TRL GRPO script runs under grpokit by changing one import line.

    from grpokit.trl import GRPOConfig, GRPOTrainer      # instead of: from trl import GRPOConfig, GRPOTrainer

``GRPOTrainer`` takes TRL 1.16's constructor arguments, maps ``GRPOConfig`` onto grpokit's
``Config`` (grpokit/trl/mapping.py; the table is docs/TRL.md) and runs grpokit's ``Trainer``.
Reward functions receive what TRL's GRPOTrainer passes them: ``prompts`` as the dataset holds them
(chat messages for conversational data), conversational completions as
``[{"role": "assistant", "content": ...}]``, ``completion_ids``, every dataset column under its own
name, ``trainer_state``, ``log_metric`` and ``log_extra``. Text prompts are used as written (no chat
template), chat-message prompts go through the tokenizer's template, as in TRL.

TRL's steps: a grpokit step samples once and makes ``num_iterations`` updates; grpokit/trl/bridge.py
turns each into its ``num_iterations`` TRL steps, so ``state`` (transformers' ``TrainerState``) counts
optimizer updates, ``logging_steps``, ``eval_steps``, ``save_steps`` and the callbacks fire at TRL's
steps, and ``log_history`` holds TRL's keys (grpokit's own metrics beside them) and TRL's final entry.
``evaluate()`` (grpokit/trl/evaluation.py) samples the eval prompts as training does and logs
``eval_loss``, ``eval_reward``, ``eval_rewards/<func>/mean`` ... ``train()`` returns transformers'
``TrainOutput``; grpokit's run summary (summary.json) is ``trainer.summary``.

Reward functions are called once per generation batch, as TRL calls them. A subclass of
``GRPOTrainer`` keeps TRL's extension contract (grpokit/trl/contract/hooks.py, docs/TRL.md): an override of
one of TRL's methods is called where TRL calls it, with TRL's inputs, and its result is used (the
override becomes the stage it replaces, grpokit/trl/contract/stages.py), or it is refused at construction in
one sentence naming it; the log says once which stages follow the subclass.

Departures from TRL, each deliberate: a reward function's failure on one completion is contained and
counted, not a crash; a checkpoint is grpokit's ``output_dir/checkpoints/step-N`` (the whole run state) and
``output_dir/checkpoint-N`` (N counted in TRL's steps) links to its model folder, which holds TRL's
``trainer_state.json``; checkpoints fall at the end of a sampling round (with num_iterations > 1
every ``save_steps // num_iterations`` rounds). grpokit's run files (metrics.jsonl, report.html) sit
in output_dir. An argument grpokit cannot carry out is refused with one sentence.
``trainer.accelerator`` answers what TRL's code asks of accelerate's ``Accelerator`` (``device``,
``gather``, ``reduce``, ``state``, process index and count, ``print`` ...), every attribute TRL's
``__init__`` sets exists with TRL's value (attributes.py), callbacks get every transformers event at
TRL's point with TRL's keywords (bridge.py), and ``trainer.end()`` leaves the process group.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, NamedTuple

from grpokit.config.base import named_as
from grpokit.config.main_guard import refuse_in_worker_start
from grpokit.config.sections import ConfigError
from grpokit.rewards.spec import RewardError
from grpokit.train import distributed

from . import best, callback_states, default_callbacks, memory, resumed_state
from .args.batch import check_whole_batch, epoch_updates, micro_steps_per_epoch, state_epochs, trl_epoch
from .args.checks import check_gated
from .args_reading import ArgsReading, Given
from .bridge import StepBridge
from .checkpoint_links import HubPush
from .config import GRPOConfig
from .contract import assignable, attributes, held_generation, held_rewards, hooks, overrides
from .contract.methods import TrlMethods
from .contract.surface import (
    Accelerator,
    add_to_logs,
    entropy_coef_of,
    last_world_entropy,
    per_token_logps_and_entropies,
    set_entropy_coef,
    set_log_level,
)
from .inputs import (
    LORA_FIELDS,
    HubPushError,
    env_owns_reward,
    push_folder,
    resume_source,
    reward_funcs_of,
    row_loader,
)
from .log_history import take_means
from .mapping import TRL_NAMES
from .reward_model import check_reward_templates
from .trainer_args import (
    is_stream,
    model_name,
    snapshot,
    trl_rollout_func,
)
from .trainer_files import TrainerFiles

__all__ = ["GRPOConfig", "GRPOTrainer", "HubPushError", "TrainOutput", "push_folder"]


class TrainOutput(NamedTuple):
    """What ``train()`` returns, as transformers' TrainOutput."""

    global_step: int
    training_loss: float
    metrics: dict[str, Any]


@hooks.recorded  # grpokit's own methods, so a subclass's override or a patch of the class is found (hooks.py)
@attributes.install  # TRL's attributes: its settings as GRPOConfig's, its state as the run's (attributes.py)
class GRPOTrainer(ArgsReading, TrlMethods, TrainerFiles):
    """TRL's GRPOTrainer on grpokit's loop; see the module docstring for what it passes and where it differs."""

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: list[Callable] | None = None,
        rollout_func: Callable | None = None,
        environment_factory: Any = None,
    ):
        refuse_in_worker_start("GRPOTrainer")  # a worker re-running the script: before anything is built
        self._overrides = hooks.check(type(self), self._own_methods)  # TRL's extension contract: honoured or refused
        self._given = Given(
            model=model,
            name=model_name(model),
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            peft_config=peft_config,
            quantization_config=quantization_config,
            optimizers=optimizers,
            environment_factory=environment_factory,
            tools=tools,
        )  # what the GRPOConfig is read with, again at train() when a script changed trainer.args (ArgsReading)
        self.args = args
        self._check_args()
        train_rows = self._train_rows()
        funcs = self._reward_funcs(reward_funcs, reward_processing_classes, environment_factory, train_rows)
        cfg = self._run_config(train_rows, len(funcs))
        self._memory_tracker = memory.TrainerMemoryTracker(self.args.skip_memory_metrics)
        self._memory_tracker.start()  # from __init__: the "init" stage (memory.py), once the arguments are checked
        self.cfg = cfg
        self._callbacks = default_callbacks.with_defaults(self.args, callbacks)  # transformers' list (flow, trackers)
        self._reward_classes = reward_processing_classes
        attributes.init_trl_attributes(self, funcs)  # reward_funcs held from here (held_rewards.py)
        self.eval_dataset = eval_dataset
        # the eval prompts are TRL's evaluate()'s (GRPOTrainer.evaluate), so grpokit's loop gets none
        self._kwargs = dict(
            reward_funcs=funcs,
            train_rows=train_rows,
            eval_rows=[],
            tools=tools,
            environment_factory=environment_factory,
            rollout_func=trl_rollout_func(rollout_func, self),
            model=None if isinstance(model, str) else model,
            tokenizer=processing_class,
        )
        overrides.samples(self)  # an override of stage 2 that cannot be honoured stops here
        self._args_seen = snapshot(self.args)
        self._init_run_state()
        self.add_callback(default_callbacks.progress(self.args))  # as transformers' __init__: an override sees it
        attributes.init_state(self, funcs, tools, environment_factory, rollout_func)
        memory.stop(self._memory_tracker, "init")

    def _reward_funcs(self, reward_funcs: Any, classes: Any, environment_factory: Any, train_rows: list) -> list:
        """The reward functions as TRL takes them (inputs.reward_funcs_of), a reward model scoring on the run's
        device as TRL's accelerator places it; one without the chat template the rows need is refused now."""
        env_reward = env_owns_reward(reward_funcs, environment_factory)
        device_of = lambda: self.accelerator.device  # noqa: E731 - read at each call: the run's, once built
        funcs = reward_funcs_of(reward_funcs, classes, env_reward, self.args.chat_template_kwargs, device_of)
        check_reward_templates(funcs, train_rows)
        return funcs

    def _init_run_state(self) -> None:
        """What the run is before it is built: none yet, nothing started, no assigned reference or checkpoint."""
        self._trainer = None  # built on first use: a resumed run must not start fresh files first
        self._started = self._init_ended = False  # train() began; on_init_end fired (once, a rebuilt run too)
        self._assigned_ref: list = []  # a ref_model assigned (assignable.py): a rebuilt run keeps it
        self.bridge: StepBridge | None = None
        self._saved_steps: set[int] = set()  # TRL steps with a checkpoint (best_model_checkpoint points at one of them)
        self.accelerator = Accelerator(lambda: self._trainer.device if self._trainer is not None else self._device())

    def _device(self) -> str:
        """The run's device before the run is built: the CPU with use_cpu, else CUDA when there is one."""
        import torch

        return "cpu" if self.args.use_cpu or not torch.cuda.is_available() else "cuda"

    def _get(self):
        if self._trainer is None:
            self._trainer = self._build(resume=None)
        return self._trainer

    def _build(self, resume):
        """grpokit's Trainer (resumed from the run folder ``resume``), with TRL's step bridge as its
        callback and the hooks that count TRL's tokens and keep its completion logs."""
        from grpokit.train.loop import Trainer

        self._reread_args()
        self.bridge = self._new_bridge()
        callbacks = [self.bridge] + (
            [HubPush(self)] if self.args.push_to_hub and self.args.hub_strategy == "every_save" else []
        )
        self.cfg.record.sinks = self._kept_sinks()
        # a sentence from inside the run names TRL's arguments, and the adapters' the peft_config fields that set them
        peft = {f: f"peft_config.{k}" for k, f in LORA_FIELDS.items()} if self._given.peft_config is not None else {}
        with named_as({**TRL_NAMES, **peft}):
            # until_max_updates: a checkpoint between two updates of a batch still runs to TRL's max_steps
            trainer = Trainer(
                self.cfg, resume=resume, callbacks=callbacks, args=self.args, until_max_updates=True, **self._kwargs
            )
        trainer.kept_checkpoint = lambda: best.kept_folder(self.bridge.state, Path(self.cfg.train.out))
        trainer.reward_state = lambda: self.bridge.state  # TRL's view: optimizer steps, max_steps, log_history
        self._connect_bridge(trainer)
        if resume and trainer.resumed_from is not None:
            self.bridge.state.global_step = trainer.updates  # the checkpoint's own count (TRL's global_step)
            default_callbacks.resumed_at(self.bridge.user.callbacks, trainer.updates + 1)  # TRL's steps from here
            saved = trainer.resumed_from / "model"  # what its checkpoint-N link names: TRL's trainer_state.json
            resumed_state.restore(self.bridge.state, saved)  # log_history, token count, best record ...
            if self.args.restore_callback_states_from_checkpoint:
                callback_states.restore(self.bridge.state, self.bridge.user.callbacks, saved)
            if (
                self.args.ignore_data_skip
            ):  # transformers: the epochs trained count, the batches of this one are not skipped
                trainer.sampler.rewind_epoch()  # an epoch of whole generation batches (10 rows, 4 a batch: 8)

        def count(sb):  # TRL's num_tokens and terminated lengths of each training sampling call
            if not self._evaluating:
                self.bridge.add_sampled(sb.rollout, sb.rollout.model_lengths())

        trainer.on_sampled.append(count)
        # the batch as trained, with the advantages the update reads (TRL logs the ones it computed)
        trainer.on_inputs.append(lambda sb, inp, rows: add_to_logs(self._logs, sb, inp.row_advantages))
        held_rewards.connect(self, trainer)  # reward_funcs / reward_weights read at every batch, as TRL's
        held_generation.apply(self, trainer)  # generation_config's sampling fields written so far
        overrides.into_slots(self, trainer)  # reward calls per batch; the subclass's overrides as the stages
        if self._assigned_ref:
            trainer.ref_model = self._assigned_ref[-1]
        if not self._init_ended:
            self._init_ended = True
            overrides.init_end(self.bridge.user)
        return trainer

    def _kept_sinks(self) -> list[str]:
        """record.sinks less the console and trackers whose default callback (ProgressCallback, TensorBoardCallback
        ...) the script removed before the run was built: they are not opened."""
        present = {default_callbacks.sink_of(cb) for cb in self._callbacks}
        stands_for = {"console", *default_callbacks.TRACKERS}
        return [s for s in self.cfg.record.sinks if s not in stands_for or s in present]

    def _new_bridge(self) -> StepBridge:
        """TRL's step counting (bridge.py): max_steps, the evaluation and checkpoint naming it calls,
        the steps of an epoch."""
        # TRL's max_steps: the mapping makes it the schedule's length, as transformers
        max_steps = self.cfg.optim.schedule_steps
        bridge = StepBridge(self.args, self._callbacks, max_steps, lambda: self.evaluate(), self._name_checkpoint, {})
        bridge.save_last = self.cfg.train.save_last
        rows, streamed = len(self._kwargs["train_rows"]), is_stream(self._given.train_dataset)
        world = distributed.position()[1]
        micro, accumulation = (
            micro_steps_per_epoch(self.args, rows, world, streamed),
            self.args.gradient_accumulation_steps,
        )
        bridge.steps_per_epoch = per_epoch = epoch_updates(micro, accumulation)
        bridge.epoch_of = lambda step: trl_epoch(step, per_epoch, micro, accumulation)
        bridge.state.num_train_epochs = state_epochs(self.args, max_steps, bridge.steps_per_epoch, streamed)
        callback_states.at_init(bridge.state, bridge.user.callbacks)
        return bridge

    def _connect_bridge(self, trainer) -> None:
        """What the bridge learns of the built Trainer: TRL steps per sampling round, the end's
        best-model load, the objects its callbacks receive; transformers' log level set after
        grpokit quieted transformers, as Trainer.__init__."""
        t = self.cfg.train
        slices = self.cfg.algo.num_iterations * t.updates_per_batch  # per grpokit step; accumulation_slices a TRL step
        self.bridge.per_round = -(-slices // t.accumulation_slices)  # at most (rolling window: some rounds one fewer)
        self.bridge.attach(trainer)  # the round's sampling metrics before its first update, grpokit's epoch
        set_log_level(self.args, self.accelerator.is_main_process)
        self.bridge.at_end = lambda: best.finish(
            trainer, self.bridge.state, self.args, self.accelerator.is_main_process
        )
        self.bridge.user.objects.update(trainer.callbacks.objects)  # model, processing_class, optimizer, lr_scheduler
        self._feed_trackers(trainer.recorder)
        a = self.args  # transformers' loaders: the training one from the start, the eval one once evaluate() runs
        per_step = a.per_device_train_batch_size * (a.steps_per_generation or a.gradient_accumulation_steps)
        self.bridge.user.objects.update(
            train_dataloader=row_loader(self._kwargs["train_rows"], per_step, a.num_generations),
            eval_dataloader=None,
        )
        self.bridge.add_final = lambda metrics: memory.stop(self._memory_tracker, "train", metrics)
        # every entry goes through self.log, as transformers' loop calls it: a subclass's log sees each one
        self.bridge.emit = lambda logs, training=False: self.log(logs, self.bridge.start if training else None)

    def _feed_trackers(self, recorder) -> None:
        """Each tracker sink gets log_history's entries from its callback (default_callbacks.py), not grpokit's
        per-round metrics."""
        sinks = getattr(recorder, "sinks", [])  # rank 0's recorder; the others' have none
        for cb in self.bridge.user.callbacks:
            name = default_callbacks.sink_of(cb)
            if name in default_callbacks.TRACKERS:
                for i, sink in enumerate(sinks):
                    if getattr(sink, "name", None) == name:
                        cb.sink, sinks[i] = sink, default_callbacks.RoundsMuted(sink)

    def _drop_sink(self, callback) -> None:
        """A default callback removed once the run is built: the sink it stands for is closed and dropped."""
        name = default_callbacks.sink_of(callback)
        sinks = getattr(self._trainer.recorder, "sinks", []) if name and self._trainer is not None else []
        for sink in [s for s in sinks if getattr(s, "name", None) == name]:
            sinks.remove(sink)
            sink.close()

    rollout_func = assignable.ROLLOUT_FUNC

    def __setattr__(self, name: str, value: Any) -> None:
        assignable.set_attribute(self, name, value)  # a patched TRL method honoured or refused, machinery refused
        object.__setattr__(self, name, value)

    # -- what TRL scripts read from the trainer
    entropy_coef = property(entropy_coef_of, set_entropy_coef)
    _last_world_entropy = property(last_world_entropy)
    _get_per_token_logps_and_entropies = per_token_logps_and_entropies
    router_aux_loss_coef = property(lambda self: self._get().router_aux)
    aux_loss_enabled = property(lambda self: self._get().router_aux != 0.0)  # a Mixture-of-Experts router loss is added
    processing_class = property(
        lambda self: self._get().tokenizer, lambda self, v: assignable.assign(self, "processing_class", v)
    )
    run_dir = property(lambda self: Path(self.cfg.train.out))
    callback_handler = property(lambda self: self._get() and self.bridge.user)

    @property
    def state(self):
        """transformers' ``TrainerState`` counted in TRL's steps (one optimizer update each)."""
        return self._get() and self.bridge.state

    @property
    def model(self):
        return self._get().model

    @property
    def ref_model(self):
        """TRL's: the reference model of the KL term (None when beta is 0 or with LoRA: the adapters off)."""
        return self._get().ref_model

    @ref_model.setter
    def ref_model(self, value) -> None:
        # TRL's meaning: the model whose log-probabilities the KL term (beta > 0) is taken against; with
        # beta 0 TRL only holds it (a subclass's teacher, say), and so does grpokit; the loop reads it every step
        self._assigned_ref[:] = [value]
        self._get().ref_model = value

    @model.setter
    def model(self, value) -> None:
        assignable.assign(self, "model", value)  # the run is built from it (optimizer, sampler), or refused

    @property
    def hub_model_id(self) -> str:
        return self.args.hub_model_id or Path(self.cfg.train.out).name

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> TrainOutput:
        """Train; ``resume_from_checkpoint`` True (or the output_dir, or a checkpoint-N folder) continues from it.
        SIGINT, SIGTERM, SIGUSR1 or SIGHUP stop the run with a checkpoint of its last finished step
        (docs/FAULTS.md); then ``summary["interrupted"]`` is True and nothing is pushed to the Hub."""
        self._reread_args()
        if not is_stream(self._given.train_dataset):  # here, not at build: evaluate() and .model need no batch
            check_whole_batch(self.args, len(self._kwargs["train_rows"]), distributed.position()[1])
        assignable.class_patches(self)  # a method patched on the class since construction: honoured or refused
        resume_from_checkpoint = resume_from_checkpoint or self.args.resume_from_checkpoint
        if resume_from_checkpoint:
            if self._kwargs["model"] is not None:
                raise ConfigError(
                    "resume_from_checkpoint needs the model passed as a name or path (an object cannot be reloaded)"
                )
            if self._trainer is not None:
                raise ConfigError(
                    "resume_from_checkpoint must come with the trainer's first use (it was already started as a new "
                    "run)"
                )
            self._trainer = self._build(resume=resume_source(self.cfg.train.out, resume_from_checkpoint))
        self._memory_tracker.start()  # from train(): the tracker's "train" stage, stopped into the final entry
        try:
            trainer = self._get()
            self._started = True  # from here the run's optimizer and sampler hold model, tokenizer, rewards
            self.summary = trainer.train()
        except RewardError as exc:  # one sentence naming the function and the row; GRPOKIT_DEBUG=1 keeps the traceback
            if os.environ.get("GRPOKIT_DEBUG"):
                raise
            raise RewardError(str(exc)) from None
        finally:
            memory.abandon(self._memory_tracker, "train")  # stopped already unless train() failed
        if self.args.push_to_hub and not self.summary.get("interrupted"):  # a signal stopped it: a checkpoint, no push
            self.push_to_hub()
        final = self.bridge.final
        return TrainOutput(self.state.global_step, final["train_loss"], {**final, "epoch": self.state.epoch})

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """TRL's evaluation (grpokit/trl/evaluation.py): logged to log_history, passed to on_evaluate, returned.
        A dict of datasets is evaluated one by one, each under ``<prefix>_<name>``, as transformers."""
        data = self.eval_dataset if eval_dataset is None else eval_dataset
        if data is None:
            raise ConfigError("evaluate() needs an eval_dataset (pass one to GRPOTrainer or to evaluate())")
        if isinstance(data, dict):
            out: dict[str, float] = {}
            for name, split in data.items():
                out.update(self.evaluate(split, ignore_keys, f"{metric_key_prefix}_{name}"))
            return out
        a = self.args
        check_gated(a, ("per_device_eval_batch_size", "num_generations_eval"), read=True)  # read whatever eval_strategy
        from .evaluation import evaluate_rows  # torch and the loss, on first use

        self._memory_tracker.start()  # from evaluate(): the "eval" stage (inside train() it is train's)
        try:
            return evaluate_rows(self, data, metric_key_prefix)
        except BaseException:
            memory.abandon(self._memory_tracker, "eval")
            raise

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """transformers' ``Trainer.log``: appended to log_history with the epoch and step, passed to on_log;
        ``start_time`` given (a training entry) adds transformers' speed metrics."""
        self._get()
        mode = "train" if start_time is not None else "eval"  # TRL's: the mode's _metrics since the last entry join it
        added = take_means(self._metrics[mode])
        self.bridge.log({**dict(logs), **added}, training=start_time is not None)

    def end(self) -> None:
        """Finish: leave the process group (transformers' ``Trainer.end``); trackers closed when training ended."""
        self.accelerator.end_training()
