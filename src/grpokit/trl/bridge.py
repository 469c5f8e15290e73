"""TRL's step count and log history on grpokit's loop.

A grpokit step samples once and makes ``num_iterations`` x ``steps_per_generation`` updates; a TRL
step is one optimizer update. ``StepBridge`` is the one callback grpokit's loop calls under
``grpokit.trl``: the loop calls it around each update (``on_update_begin``, ``on_optimizer_step``), so a
TRL step begins, ends and logs around its own update, with ``state.global_step`` advanced per update, as
TRL's callbacks see it; ``logging_steps``, ``eval_steps``, ``save_steps`` run at TRL's steps, and it writes
``log_history`` as TRL does: per logged step the mean of every metric since the last log (the
step's sampling metrics ride on its first update, as TRL logs them), then TRL's final entry
(``train_runtime`` ...). grpokit's own metrics stay in the entries beside TRL's. This module is the events'
flow; the entries' values are log_history.py's, a round's metrics reward_stats.py's and round_tokens.py's.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerState

from grpokit.config.sections import ConfigError
from grpokit.train.callbacks import Callbacks
from grpokit.train.step_metrics import STEP_ONLY

from .args.rule import every_steps
from .best import update_best
from .default_callbacks import RESETS, TRL_EVENTS, DefaultFlowCallback, TrlControl
from .log_history import add_values, filtered_loss, final_entry, own_entry, take_means
from .memory import empty_device_cache
from .reward_stats import round_metrics
from .round_tokens import round_counts, sampled_tokens, terminated_lengths

log = logging.getLogger("grpokit.trl")


class StepBridge:
    """grpokit loop events -> TRL steps, log history and the user's callbacks (see the module docstring).
    ``evaluate()`` is the trainer's evaluation, ``save_link(path, step)`` names a checkpoint as TRL does."""

    def __init__(
        self,
        args: Any,
        callbacks: list,
        max_steps: int,
        evaluate: Callable[[], dict],
        save_link: Callable[[Path, int], None],
        objects: dict,
    ):
        self.args = args
        self.state = TrainerState(
            max_steps=max_steps,
            logging_steps=every_steps(args.logging_steps, max_steps, state=True),
            eval_steps=every_steps(args.eval_steps or args.logging_steps, max_steps, state=True),
            save_steps=_save_period(500 if args.save_steps is None else args.save_steps, max_steps),
            train_batch_size=args.per_device_train_batch_size,
            num_train_epochs=args.num_train_epochs,
        )
        self.user = Callbacks(
            callbacks, args, self.state, events=TRL_EVENTS, control=TrlControl(), resets=RESETS, **objects
        )
        for cb in self.user.callbacks:  # DefaultFlowCallback's should_save: grpokit's schedule, at a round's end
            if isinstance(cb, DefaultFlowCallback):
                cb.save_due = self._save_due
        self.round_save = False  # grpokit's loop checkpoints after the round this TRL step ends (on_step_end)
        self.save_asked: int | None = None  # the TRL step whose should_save waits for the round's end
        self.save_moved_warned = False
        self.last_logged = 0  # transformers' _globalstep_last_logged
        self.save_last = True  # train.save_last: the run's last TRL step is checkpointed (set by the trainer)
        self.evaluate, self.save_link = evaluate, save_link
        self.sampled: list[tuple[float, list[int]]] = []  # this round's sampling calls: tokens, terminated lengths
        self.dist: Any = None  # the trainer's DistContext (attach): the round's tokens and lengths of every rank
        self.pending: dict[str, list[float]] = defaultdict(list)  # TRL's _metrics["train"] (cleared, never replaced)
        self.own: dict[str, list[float]] = {}  # transformers' own entry values since the last log (OWN_KEYS)
        self.losses: list[float] = []
        self.mark = self.start = time.perf_counter()
        self.tokens_at_start = 0
        self.step_at_start = 0
        self.at_end: Callable[[], None] = lambda: None  # best model loaded, checkpoints rotated (best.finish)
        self.per_round = 1  # TRL steps per grpokit step (num_iterations * updates per batch), set by the trainer
        self.steps_per_epoch = (
            0  # TRL steps in one epoch (step_args.steps_per_epoch), set by the trainer; 0: grpokit's epoch
        )
        # TRL's epoch after a step: the trainer sets transformers' count of micro-batches (args.batch.trl_epoch)
        self.epoch_of: Callable[[int], float] = lambda s: s / self.steps_per_epoch if self.steps_per_epoch else 0.0
        self.begun = False  # the user's on_step_begin of the next TRL step was called
        self.open: tuple[dict, float] | None = None  # the applied update whose TRL step has not ended, its seconds
        self.told = False  # the loop told of this round's sampling (sampled_round)
        self.round_keys: set[str] = set()  # the round's sampling metrics' names, and its updates' (update_keys)
        self.update_keys: set[str] = set()
        self.in_epoch = False  # the user's on_epoch_begin of the running epoch was called
        self.add_final: Callable[[dict], None] = lambda metrics: None  # the memory metrics (trainer.py) join the end
        # (logs, training): the trainer's log(), which may be a subclass's, and adds _metrics["train"] as TRL's
        self.emit: Callable[..., None] = lambda logs, training=False: self.log(
            {**logs, **self.take_metrics()}, training
        )

    def attach(self, trainer) -> None:
        """Told by grpokit's ``trainer`` of each round's sampling metrics (reward_stats.round_metrics, reduced over
        ranks) before its first update."""
        self.dist = trainer.dist
        trainer.on_inputs.append(
            lambda sb, inputs, rows: self.sampled_round(round_metrics(trainer, self.args, sb, inputs, rows))
        )

    # ---- grpokit loop events
    def on_train_begin(self, args, state, control, **kw):
        self.mark = self.start = time.perf_counter()
        self.tokens_at_start = self.state.num_input_tokens_seen  # a resumed run's speed counts this session's tokens
        self.step_at_start = self.state.global_step  # and its final entry this session's steps
        self.user("on_train_begin")
        if self.args.eval_on_start:
            self.evaluate()

    def on_step_begin(self, args, state, control, **kw):
        self.mark, self.sampled, self.told = time.perf_counter(), [], False
        self.round_keys, self.update_keys = set(), set()
        n, g = self.args.torch_empty_cache_steps, self.state.global_step
        if n and any(
            s % n == 0 for s in range(g, g + self.per_round)
        ):  # transformers: before a step whose completed count is a multiple
            empty_device_cache()
        if not self.begun:  # a round that applied no update left its TRL step begun
            self._begin_step()

    def sampled_round(self, metrics: dict[str, float]) -> None:
        """The round is sampled and scored (its metrics, reduced over ranks): TRL logs them with the round's
        first optimizer step; ``num_tokens`` (every process's tokens, TRL's running total) and the terminated
        lengths of every process's completions join them. Collective under torchrun (every rank calls it)."""
        calls, tokens, done = round_counts(self.sampled, self.dist)  # TRL's: every process's
        extras: dict[str, float] = {}
        if calls:
            self.state.num_input_tokens_seen += int(tokens)
            extras = {"num_tokens": float(self.state.num_input_tokens_seen), **terminated_lengths(done)}
        self.sampled = []
        self.told = True  # the metrics join _metrics["train"] now: TRL's holds the batch's before its loss is computed
        self.round_keys = set(metrics) | set(extras)
        self._accumulate({**metrics, **extras})

    def on_update_begin(self, args, state, control, **kw):
        """An optimizer update begins: the TRL step of the round's previous update ends here (TRL's on_step_end
        and log come before the next step's micro-batches), and the next TRL step begins, unless that one
        stopped the run."""
        if self.open is not None:
            self._end_step({}, control)
            if control.should_training_stop:
                return control
        if not self.begun:
            self._begin_step()
        return control

    def _begin_step(self) -> None:
        """A TRL step begins: the epoch first when none is running (transformers' epoch loop)."""
        if not self.in_epoch:
            self.in_epoch = True
            self.user("on_epoch_begin")
        self.user("on_step_begin")
        self.begun = True

    def on_pre_optimizer_step(self, args, state, control, **kw):
        """Before the update's optimizer step: transformers' on_substep_end after each micro-batch but the
        last (gradient_accumulation_steps of them make a TRL step), then on_pre_optimizer_step."""
        for _ in range(max(0, self.args.gradient_accumulation_steps - 1)):
            self.user("on_substep_end")
        self.user("on_pre_optimizer_step")

    def on_optimizer_step(self, args, state, control, metrics=None, **kw):
        """The update is applied: its TRL step stays open until the next update begins or the round ends
        (whichever comes first ends it, with TRL's on_step_end and log), so the round's last step's entry
        also gets the round's own metrics (timings ...)."""
        now = time.perf_counter()
        self.open, self.mark = (dict(metrics or {}), now - self.mark), now
        self.update_keys |= set(self.open[0])
        self.user("on_optimizer_step")

    def on_step_end(self, args, state, control, metrics=None, **kw):
        """The round ends: its last TRL step ends with the round's own metrics (timings ...; its updates' are each
        in its own step's entry), or, when that step has ended already (a rolling window's last slices wait for the
        next round's), they wait for the step of the update that follows."""
        if not self.told:  # not told of the round's sampling (grpokit's loop always tells)
            self.sampled_round({})
        elsewhere = self.round_keys | self.update_keys | set(STEP_ONLY)  # not the loop's mean over the updates
        rest = {k: v for k, v in (metrics or {}).items() if k not in elsewhere}
        if self.open is not None:
            self.round_save = control.should_save  # grpokit's schedule (train.save_every, the last step)
            self._end_step(rest, control)
            self.round_save = False
        else:  # no TRL step open: they wait for the next step's entry
            self._accumulate(rest)
        control.should_save = self._take_save()
        return control

    def _save_due(self) -> bool:
        """grpokit's checkpoint schedule at this TRL step: the round's end when train.save_every falls there, and
        the run's last step."""
        return self.round_save or (self.state.global_step >= self.state.max_steps and self.save_last)

    def _take_save(self) -> bool:
        """At a round's end: whether grpokit's loop checkpoints now, as the callbacks' should_save asked at one
        of the round's TRL steps; a step before the round's last is saved here, with a warning (once)."""
        asked, self.save_asked = self.save_asked, None
        if asked is not None and asked != self.state.global_step and not self.save_moved_warned:
            self.save_moved_warned = True
            log.warning(
                "control.should_save at TRL step %d is carried out at step %d: grpokit writes checkpoints between "
                "sampling rounds (each round makes num_iterations x steps_per_generation TRL steps)",
                asked,
                self.state.global_step,
            )
        return asked is not None

    def _end_step(self, rest: dict[str, float], control) -> None:
        """The open TRL step ends: global_step advances, its entry (the round's sampling metrics on the round's
        first step, ``rest`` on its last) is kept for the next log, on_step_end, log and evaluate when due;
        the loop is told to stop at TRL's max_steps or when a callback asked."""
        update, seconds = self.open
        self.open, self.begun = None, False
        self.state.global_step += 1
        step = self.state.global_step
        self.state.epoch = self.epoch_of(step)
        # the round's own metrics (on its last step), the update's own over them (loss, grad_norm, clip ratios with
        # TRL's per-sequence extremes clip_ratio/low_min and /high_max: algo/loss.py clip_metrics), its seconds
        self._accumulate({**rest, **update, "step_time": seconds})
        self.user("on_step_end")
        self._log_save_evaluate()
        self._maybe_end_epoch()
        if self.user.control.should_training_stop or self.state.global_step >= self.state.max_steps:
            control.should_training_stop = True

    def on_save(self, args, state, control, checkpoint=None, **kw):
        self.save_asked = None
        if checkpoint is not None:
            self.save_link(Path(checkpoint), self.state.global_step)
        self.user("on_save")

    def on_train_end(self, args, state, control, **kw):
        rest = take_means(self.pending)
        self.own.clear()
        completions = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
        self.final = final_entry(
            self.state.global_step - self.step_at_start,
            self.losses,
            time.perf_counter() - self.start,
            completions,
            self.state.total_flos,
        )
        self.add_final(self.final)
        self.emit({**self.final, **rest})  # TRL merges the metrics of steps after the last log into its final entry
        self.at_end()  # as transformers: after the final log, before on_train_end
        self.user("on_train_end")

    def add_sampled(self, rollout, lengths: list[int]) -> None:
        """A sampling call of this round (several with dynamic sampling): its tokens and terminated lengths,
        counted over the round's calls (and every rank's) when the round is sampled (``sampled_round``)."""
        self.sampled.append(sampled_tokens(rollout, lengths))

    # ---- TRL's logging
    def take_metrics(self) -> dict[str, float]:
        """TRL's ``log``: the means of ``_metrics["train"]`` since the last entry, which it then clears."""
        return take_means(self.pending)

    def log(self, logs: dict[str, float], training: bool = False) -> None:
        """transformers' ``Trainer.log``: the epoch added, appended to log_history with the step, on_log.
        With include_num_input_tokens_seen the running token count joins every entry, and a training
        entry gets the session's train_runtime and train_tokens_per_second (transformers' speed_metrics)."""
        entry = {**logs, "epoch": self.state.epoch}
        if self.args.include_num_input_tokens_seen not in ("no", False):
            entry["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if training:
                runtime = time.perf_counter() - self.start
                entry["train_runtime"] = round(runtime, 4)
                if runtime > 0:
                    entry["train_tokens_per_second"] = round(
                        (self.state.num_input_tokens_seen - self.tokens_at_start) / runtime, 3
                    )
        self.state.log_history.append({**entry, "step": self.state.global_step})
        self.user("on_log", logs=entry)

    def _accumulate(self, metrics: dict[str, float]) -> None:
        """Values for the next log entry (log_history.add_values), a step loss filtered as
        logging_nan_inf_filter says and kept for train_loss."""
        if "loss" in metrics:
            metrics = {
                **metrics,
                "loss": filtered_loss(metrics["loss"], self.own.get("loss", []), self.args.logging_nan_inf_filter),
            }
            self.losses.append(metrics["loss"])
        add_values(metrics, self.own, self.pending)

    def _log_save_evaluate(self) -> None:
        """transformers' ``_maybe_log_save_evaluate``: what the callbacks' control asks after a TRL step (the
        flow callback, DefaultFlowCallback, sets it by logging_steps, eval_steps ...): log, evaluate
        (metric_for_best_model ranks it), and a checkpoint, written when the sampling round ends."""
        c, step = self.user.control, self.state.global_step
        if c.should_log and step > self.last_logged:
            self.last_logged = step
            self._flush()
        if c.should_evaluate:
            update_best(self.state, self.args, self.evaluate())
        if c.should_save and self.save_asked is None:
            self.save_asked = step

    def _maybe_end_epoch(self) -> None:
        """transformers' epoch loop: it ends at the epoch's last step, at the run's last, when a callback asks to
        stop, or (the run's last epoch only, see below) when one asks to stop the epoch; on_epoch_end, then
        what the control asks."""
        step, c = self.state.global_step, self.user.control
        if c.should_epoch_stop:
            self._stop_epoch()
        last = step >= self.state.max_steps
        if not (last or c.should_training_stop or (self.steps_per_epoch and step % self.steps_per_epoch == 0)):
            return
        if self.in_epoch:
            self.in_epoch = False
            self.user("on_epoch_end")
            self._log_save_evaluate()

    def _stop_epoch(self) -> None:
        """control.should_epoch_stop: in the run's last epoch it ends the run, as transformers' epoch loop
        ends there; an earlier epoch cannot be cut short (grpokit's prompt sampler serves the epoch's
        remaining prompts next), so it is refused in one sentence."""
        spe, step, total = self.steps_per_epoch, self.state.global_step, self.state.max_steps
        if spe and (step - 1) // spe == (total - 1) // spe:
            self.user.control.should_training_stop = True  # transformers: no epoch follows the last one
            return
        raise ConfigError(
            f"control.should_epoch_stop=True at TRL step {step}: grpokit.trl cannot end an epoch before the run's "
            "last one early (its prompt sampler would serve that epoch's remaining prompts next); set "
            "should_training_stop to end the run"
        )

    def _flush(self) -> None:
        """transformers' log of the window: the mean loss and the last step's grad_norm and learning_rate; the
        trainer's log() (TRL's, or a subclass's over it) adds the means of ``_metrics["train"]`` and clears it,
        so a subclass's log() still reads the window's metrics there before ``super().log``."""
        if any(self.own.values()) or any(self.pending.values()):
            logs = own_entry(self.own)
            self.own.clear()
            self.emit(logs, training=True)
        self.pending.clear()


def _save_period(value: float, steps: int) -> int:
    """transformers' ``state.save_steps``: as logging_steps' (args/rule.py every_steps), but a value <= 0 is its
    ceil(steps * value), 0 included and never refused: transformers' flow callback saves at no step then."""
    return every_steps(value, steps, state=True) if value > 0 else math.ceil(value * steps)
