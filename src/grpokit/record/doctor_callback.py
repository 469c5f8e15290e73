"""The doctor inside someone else's trainer: a transformers ``TrainerCallback`` for TRL's
``GRPOTrainer`` (or any ``Trainer``).

    from grpokit.record.doctor_callback import DoctorCallback
    trainer = GRPOTrainer(..., callbacks=[DoctorCallback(stop_on="error")])

Every time the trainer logs, the callback adds the logged metrics (their names made grpokit's by
run_readers.canonical, so verl-style or prefixed names work too) to the run's history and runs the
doctor's checks (the same ``CHECKS`` as ``grpokit doctor``) every ``every`` logs; a finding is printed
once, when it first appears, and kept in ``findings``. With ``stop_on="error"`` (or ``"warning"``) a
finding of that level asks the trainer to stop (``control.should_training_stop``) after saying why.
Subclassing ``TrainerCallback`` is the interface transformers asks of a callback, not a reuse of code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .doctor import diagnose, health_config
from .findings import LEVELS, DoctorConfig, Finding
from .report_data import Run
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
        self.every, self.stop_on, self.log = every, stop_on, log
        self.config = config or DoctorConfig()
        self.health = dict(health or {})
        self.rows: list[dict[str, Any]] = []
        self.findings: list[tuple[int, Finding]] = []  # (step first seen, finding), in order of appearance
        self._logs = 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        row: dict[str, Any] = {"step": int(state.global_step)}
        for k, v in (logs or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "epoch":
                row.setdefault(canonical(k), float(v) if math.isfinite(v) else v)
        if self.rows and self.rows[-1]["step"] == row["step"]:
            self.rows[-1] |= {k: v for k, v in row.items() if k not in self.rows[-1]}  # train and eval of one step
        else:
            self.rows.append(row)
        self._logs += 1
        if self._logs % self.every == 0:
            self.check(Path(getattr(args, "output_dir", ".") or "."), row["step"], control)
        return control

    def check(self, output_dir: Path, step: int, control: Any = None) -> list[Finding]:
        """Run the checks on the history so far; print and keep the findings not seen before."""
        run = Run(output_dir, output_dir.name, metrics=list(self.rows))
        seen = {f.code for _, f in self.findings}
        new = [f for f in diagnose(run, self.config, health_config(run, self.health)) if f.code not in seen]
        for f in new:
            self.findings.append((step, f))
            self.log(f"grpokit doctor: step {step}: [{f.code}] ({f.level}) {f.title}; {f.evidence}; try: {f.advice}")
        stop = [f for f in new if self.stop_on and LEVELS.index(f.level) >= LEVELS.index(self.stop_on)]
        if stop and control is not None:
            self.log(f"grpokit doctor: stopping the run at step {step} on [{stop[0].code}] (stop_on={self.stop_on!r})")
            control.should_training_stop = True
        return new
