"""GRPOTrainer's arguments read into grpokit's run: at construction, and again at ``train()`` when a script
changed ``trainer.args`` in between (transformers reads its arguments when train() starts). ``ArgsReading`` is a
mixin of GRPOTrainer (trainer.py); trainer_args.py holds the functions it calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .contract import attributes, overrides
from .inputs import environment_owned_rows, rows_of
from .trainer_args import (
    apply_process_settings,
    changed_fields,
    checked_args,
    is_stream,
    refuse_late_changes,
    run_config,
    snapshot,
    stream_rows,
)


@dataclass(frozen=True, kw_only=True)  # built by keyword (house rule): nine fields in a row are easy to swap
class Given:
    """The constructor's arguments the GRPOConfig is read with."""

    model: Any
    name: str
    train_dataset: Any
    eval_dataset: Any
    processing_class: Any
    peft_config: Any
    quantization_config: Any
    optimizers: tuple
    environment_factory: Any
    tools: Any = None


class ArgsReading:
    def _check_args(self) -> None:
        g = self._given
        self.args = checked_args(
            self.args, g.name, g.train_dataset, g.eval_dataset, g.quantization_config, g.optimizers
        )

    def _train_rows(self) -> list:
        data = environment_owned_rows(self._given.environment_factory, self._given.train_dataset, self.args)
        return rows_of(data, "train_dataset", self.args.remove_unused_columns, stream_rows(self.args))

    def _run_config(self, train_rows: list, num_funcs: int):
        """grpokit's Config of ``self.args`` (trainer_args.run_config), and the process-wide settings TRL applies."""
        g = self._given
        streamed = is_stream(g.train_dataset)
        cfg = run_config(
            self.args,
            g.model,
            g.name,
            g.processing_class,
            g.peft_config,
            len(train_rows),
            streamed,
            num_funcs,
            episodes=bool(g.tools or g.environment_factory),  # TRL reads its episode settings only then
        )
        apply_process_settings(self.args, g.model)
        return cfg

    def _reread_args(self) -> None:
        """transformers reads its arguments when train() starts, so a script may change ``trainer.args`` between
        construction and train(): the changed GRPOConfig is read again here, before the run is built, and every
        field takes its new value (TRL itself keeps the construction's value of its own GRPO fields). A change
        after the build, or of a field that acted at construction, is refused in one sentence."""
        changed = changed_fields(self.args, self._args_seen)
        if not changed:
            return
        refuse_late_changes(changed, built=self._trainer is not None)
        self._read_inputs()

    def _read_inputs(self) -> None:
        """The GRPOConfig and the constructor's inputs (``_given``) read into the run's config and training rows
        again: after a change of ``trainer.args`` or an assigned ``train_dataset``, before the run is built."""
        self._check_args()
        train_rows = self._train_rows()
        self.cfg = self._run_config(train_rows, len(self._reward_funcs))
        self._kwargs["train_rows"] = train_rows
        attributes.init_trl_attributes(self, self._reward_funcs)
        overrides.samples(self)
        self._args_seen = snapshot(self.args)
