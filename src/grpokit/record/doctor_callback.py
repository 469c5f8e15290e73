"""The doctor inside someone else's trainer: a transformers ``TrainerCallback`` for TRL's
``GRPOTrainer`` (or any ``Trainer``).

    from grpokit.record.doctor_callback import DoctorCallback
    trainer = GRPOTrainer(..., callbacks=[DoctorCallback(stop_on="error")])

Every time the trainer logs, the callback adds the logged metrics (their names made grpokit's by
run_readers.canonical, so verl-style or prefixed names work too) to the run's history and runs the
doctor's checks (the same ``CHECKS`` as ``grpokit doctor``, through doctor_live.DoctorWatch, as the
live monitor of ``grpokit train`` does) every ``every`` logs; a finding is printed
once, when it first appears, and kept in ``findings``. With ``stop_on="error"`` (or ``"warning"``) a
finding of that level asks the trainer to stop (``control.should_training_stop``) after saying why.
Subclassing ``TrainerCallback`` is the interface transformers asks of a callback, not a reuse of code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .doctor_live import DoctorWatch
from .findings import LEVELS, DoctorConfig, Finding
from .run_readers import canonical


class DoctorCallback(TrainerCallback):
    """Run the doctor's checks on the metrics a Trainer logs, as it logs them."""

    def __init__(
        self,
        every: int = 1,
        stop_on: str | None = None,
        config: DoctorConfig | None = None,
        health: dict[str, Any] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        if stop_on not in (None, "warning", "error"):
            raise ValueError(f"DoctorCallback(stop_on={stop_on!r}) is not valid; give None, 'warning' or 'error'")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"DoctorCallback(every={every!r}) is not valid; give a positive number of logs")
        self.stop_on, self.log = stop_on, log
        self.watch = DoctorWatch(every=every, config=config or DoctorConfig(), health=dict(health or {}))
        self.findings: list[tuple[int, Finding]] = []  # (step first seen, finding), in order of appearance

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The metrics logged so far, one row per step, names made grpokit's."""
        return self.watch.rows

    def on_log(self, args, state, control, logs=None, **kwargs):
        step = int(state.global_step)
        row: dict[str, Any] = {"step": step}
        for k, v in (logs or {}).items():
            if k != "epoch":
                row.setdefault(canonical(k), v)
        self.watch.path = Path(getattr(args, "output_dir", None) or ".")
        new = self.watch.add(row)
        for f in new:
            self.findings.append((step, f))
            self.log(f"grpokit doctor: step {step}: [{f.code}] ({f.level}) {f.title}; {f.evidence}; try: {f.advice}")
        stop = [f for f in new if self.stop_on and LEVELS.index(f.level) >= LEVELS.index(self.stop_on)]
        if stop:
            self.log(f"grpokit doctor: stopping the run at step {step} on [{stop[0].code}] (stop_on={self.stop_on!r})")
            control.should_training_stop = True
        return control
