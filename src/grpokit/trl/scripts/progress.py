"""TRL's ``RichProgressCallback`` (imported by TRL's OpenEnv example scripts beside GRPOConfig): a
progress bar of the training steps, with each log entry printed above it, on the main process only.

TRL draws it with rich; this one uses tqdm (a transformers dependency), so it needs nothing more.
It implements only events grpokit's trainer calls (grpokit refuses a callback with others).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback


class RichProgressCallback(TrainerCallback):
    """Progress of the TRL steps (``state.max_steps``) and the logged metrics, on process 0."""

    def __init__(self) -> None:
        self.bar: Any = None

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps or None, desc="training", unit="step", dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        if self.bar is not None and logs:
            shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in logs.items()}
            self.bar.write(str(shown))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):  # noqa: ANN001
        if self.bar is not None and metrics:
            self.bar.write(str({k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()}))

    def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001
        if self.bar is not None:
            self.bar.close()
            self.bar = None
