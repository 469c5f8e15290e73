"""The console sink: a progress bar with ETA and one live line of the figures that matter.

In a terminal it draws a rich progress bar (steps done / total, elapsed, time remaining) with a line
of key figures under it, refreshed on every `log`; health warnings are printed above the bar in
yellow so they stay on screen after the bar moves on (information such as "converged" in plain text).

When stdout is not a terminal (CI logs, `nohup`, a notebook capturing output, `| tee`), redrawing a
bar would fill the log with control codes, so it prints one plain line every `every` steps instead:

    step 20/200 (10%) | reward 0.412 | reward_std 0.23 | kl 0.0031 | ... | 1.9 s/step | eta 5m42s
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

# The figures shown on the live line, in order, with their short labels. Missing ones are skipped.
KEY_FIGURES: tuple[tuple[str, str], ...] = (
    ("reward", "reward"),
    ("reward_std", "reward_std"),
    ("eval/accuracy", "eval_acc"),
    ("frac_reward_zero_std", "zero_std"),
    ("kl", "kl"),
    ("entropy", "entropy"),
    ("completions/mean_length", "len"),
    ("clip_ratio/region_mean", "clip"),
    ("loss", "loss"),
    ("grad_norm", "grad_norm"),
    ("tokens_per_second", "tok/s"),
)


def format_value(value: float) -> str:
    """Compact number for a console line: 3 significant digits, no scientific notation for usual sizes."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.2e}"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def format_duration(seconds: float) -> str:
    """3725 -> '1h02m', 342 -> '5m42s', 9.5 -> '9.5s'."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def key_figures_line(metrics: Mapping[str, Any]) -> str:
    """'reward 0.412 | kl 0.0031 | ...' for the figures of KEY_FIGURES present in `metrics`."""
    parts = [f"{label} {format_value(metrics[key])}" for key, label in KEY_FIGURES if key in metrics]
    return " | ".join(parts)


class ConsoleSink:
    """Progress bar + live line in a terminal, a plain line every `every` steps elsewhere.

    Args:
        total_steps: the number of optimizer steps the run will take (the bar's 100%).
        every: in non-terminal mode, print a line when `step % every == 0`, on the last step and on
            every step that carries `eval/accuracy`.
        start_step: the step a resumed run starts from, so the ETA is not skewed by steps done before.
        stream: where to write (default stdout).
        live: force terminal (True) or plain-line (False) mode; None decides from `stream.isatty()`.
    """

    name = "console"

    def __init__(
        self,
        total_steps: int,
        every: int = 10,
        start_step: int = 0,
        stream: TextIO | None = None,
        live: bool | None = None,
    ) -> None:
        self.total_steps = max(int(total_steps), 1)
        self.every = max(int(every), 1)
        self.start_step = start_step
        self.stream = stream if stream is not None else sys.stdout
        self.console = Console(file=self.stream, force_terminal=live, highlight=False)
        self.is_live = self.console.is_terminal if live is None else live
        self._t0: float | None = None
        self._live: Live | None = None
        if self.is_live:
            self._progress = Progress(
                TextColumn("[bold cyan]grpo"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._task = self._progress.add_task("train", total=self.total_steps, completed=start_step)
            self._figures = Text("waiting for the first step ...", style="dim")
            self._live = Live(Group(self._progress, self._figures), console=self.console, refresh_per_second=4)
            self._live.start()

    def eta_seconds(self, step: int) -> float:
        """Remaining time from the mean time per step since this sink saw its first step."""
        if self._t0 is None or step <= self.start_step:
            return math.nan
        per_step = (time.monotonic() - self._t0) / (step - self.start_step)
        return per_step * max(self.total_steps - step, 0)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self._t0 is None:
            self._t0 = time.monotonic()
            # The first step's own duration is not yet in the clock; count from one step earlier.
            if "time/step" in metrics and math.isfinite(float(metrics["time/step"])):
                self._t0 -= float(metrics["time/step"])
        line = key_figures_line(metrics)
        if self._live is not None:
            self._progress.update(self._task, completed=min(step, self.total_steps))
            self._figures.plain = line
            self._figures.style = "none"  # the first line was a dim placeholder
            return
        due = step % self.every == 0 or step >= self.total_steps or "eval/accuracy" in metrics
        if due:
            pct = 100.0 * step / self.total_steps
            head = f"step {step}/{self.total_steps} ({pct:.0f}%)"
            tail = [f"{format_value(metrics['time/step'])} s/step"] if "time/step" in metrics else []
            tail.append(f"eta {format_duration(self.eta_seconds(step))}")
            print(" | ".join([head, line, *tail] if line else [head, *tail]), file=self.stream, flush=True)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass  # samples are for files and dashboards, not for the console

    def warn(self, step: int, event: Any) -> None:
        message = getattr(event, "message", str(event))
        monitor = getattr(event, "monitor", "warning")
        if getattr(event, "level", "warning") == "info":  # e.g. "converged": worth reading, nothing to fix
            if self.is_live:
                self.console.print(
                    f"step {step} health/{escape(monitor)}: {escape(message)}", markup=True, highlight=False
                )
            else:
                print(f"note: step {step} health/{monitor}: {message}", file=self.stream, flush=True)
            return
        if self.is_live:
            self.console.print(
                f"[yellow]step {step} health/{escape(monitor)}:[/yellow] {escape(message)}",
                markup=True,
                highlight=False,
            )
        else:
            print(f"WARNING step {step} health/{monitor}: {message}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
