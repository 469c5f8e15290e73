"""The recorder: the one object the trainer hands its metrics, samples and warnings to.

The trainer produces one flat dict of floats per step ({"reward": 0.41, "kl": 0.003, ...}, names
follow TRL's where the concept is the same, see docs/MONITORING.md) and calls

    recorder.log(metrics, step)          every step (and on eval steps, with "eval/accuracy")
    recorder.amend(metrics, step)        a step's metrics that came late: an evaluation a stop cut, made up at
                                         --resume (metrics.jsonl's row of the step gets them)
    recorder.log_samples(step, rows)     a few prompts with all their completions, every N steps
    recorder.warn(step, event)           anything the user must read (health monitors use it too)
    recorder.close()                     once, in a `finally`

The recorder fans each call out to its sinks (a sink is anything with those four methods: console,
jsonl, tensorboard, wandb, mlflow, trackio) and runs the health monitors on the way: their
`health/*` figures join the metrics, their warnings go through `warn`, and after too many NaN steps
in a row `log` raises `TrainingHealthError` (once the step is safely written).

Library users who want no output at all get `NullRecorder`, which accepts every call and does
nothing; it is the trainer's default so that calling the trainer from Python never prints or writes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from grpokit.config.health import HealthConfig

from .console import ConsoleSink
from .doctor_live import LIVE_MONITORED, DoctorWatch
from .health import HealthEvent, HealthMonitor
from .jsonl import JsonlSink


class Sink(Protocol):
    """Where records go. Sinks must not raise for values they cannot show: they skip them."""

    name: str

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None: ...

    def warn(self, step: int, event: HealthEvent) -> None: ...

    def close(self) -> None: ...


class NullRecorder:
    """Accepts every call and does nothing: the default for library use and tests."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass

    def amend(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def wants_samples(self, step: int) -> bool:
        return False

    def warn(self, step: int, event: HealthEvent | str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NullRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Recorder(NullRecorder):
    """Fans records out to sinks and runs the health monitors. Build it with `make_recorder`.

    Args:
        sinks: the sink objects, called in order.
        health: the health monitor; None runs no monitors.
        samples_every: `log_samples` keeps rows only on steps that are multiples of this (0: never).
        samples_prompts: at most this many prompts (rows) are kept per sampled step.
    """

    def __init__(
        self,
        sinks: list[Sink],
        health: HealthMonitor | None = None,
        samples_every: int = 10,
        samples_prompts: int = 4,
    ) -> None:
        self.sinks = list(sinks)
        self.health = health
        self.samples_every = samples_every
        self.samples_prompts = samples_prompts
        self._closed = False

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record one step's metrics. May raise TrainingHealthError after the step is written."""
        record = dict(metrics)
        events: list[HealthEvent] = []
        if self.health is not None:
            events, health_metrics = self.health.observe(record, step)
            record.update(health_metrics)
        self._each(step, "log", record, step)
        for event in events:
            self.warn(step, event)
        if self.health is not None:
            self.health.raise_if_fatal()

    def amend(self, metrics: Mapping[str, float], step: int) -> None:
        """Metrics of a step already recorded (an evaluation a stop cut, run at --resume): metrics.jsonl's row of
        ``step`` gets them, the other sinks log them at that step. No health monitor sees them twice."""
        self._each(step, "amend", metrics, step, sinks=[s for s in self.sinks if isinstance(s, JsonlSink)])
        self._each(step, "log", metrics, step, sinks=[s for s in self.sinks if not isinstance(s, JsonlSink)])

    def wants_samples(self, step: int) -> bool:
        """True on the steps where `log_samples` keeps rows: lets the trainer skip building them."""
        return self.samples_every > 0 and step % self.samples_every == 0

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Record a few prompts with their completions (see `grpokit.record.samples.sample_rows`)."""
        if not self.wants_samples(step) or not rows:
            return
        self._each(step, "log_samples", step, rows[: self.samples_prompts])

    def warn(self, step: int, event: HealthEvent | str) -> None:
        """Show a warning on every sink; a plain string becomes a HealthEvent from monitor "note"."""
        if isinstance(event, str):
            event = HealthEvent(step, "note", event)
        self._each(step, "warn", step, event)

    def close(self) -> None:
        """Close every sink (flushes files, finishes tracker runs). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._each(-1, "close")

    def _each(self, step: int, method: str, *args: Any, sinks: list[Sink] | None = None) -> None:
        """Call `method` on every sink (of ``sinks``, when given). A failing tracker is dropped with a warning,
        training goes on: metrics.jsonl is the record of the run, so only a failure of the jsonl sink is raised."""
        for sink in list(self.sinks if sinks is None else sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as e:
                if getattr(sink, "name", "") == "jsonl":
                    raise
                self.sinks.remove(sink)
                if method != "close":
                    self._each(
                        step,
                        "warn",
                        step,
                        HealthEvent(
                            step,
                            "sink",
                            (
                                f"the {getattr(sink, 'name', sink)} sink failed in "
                                f"{method} ({type(e).__name__}: {e}) and was "
                                "switched off; metrics.jsonl still has every step."
                            ),
                        ),
                    )


def _console(
    run_dir: Path | None, total_steps: int, config: Mapping[str, Any], resume_step: int | None, **kw: Any
) -> Sink:
    return ConsoleSink(total_steps, every=int(kw.get("console_every", 10)), start_step=resume_step or 0)


def _tracker(kind: str) -> Callable[..., Sink]:
    def build(
        run_dir: Path | None, total_steps: int, config: Mapping[str, Any], resume_step: int | None, **kw: Any
    ) -> Sink:
        from . import trackers  # lazy: the tracker packages are optional extras

        return trackers.make_tracker(
            kind, run_dir, config, project=kw.get("project"), run_name=kw.get("run_name"), resume_step=resume_step
        )

    return build


SINKS: dict[str, Callable[..., Sink]] = {
    "console": _console,
    "tensorboard": _tracker("tensorboard"),
    "wandb": _tracker("wandb"),
    "mlflow": _tracker("mlflow"),
    "trackio": _tracker("trackio"),
}
"""Sink builders by the name used in the config's sink list. "jsonl" is always on with a run dir."""


def make_recorder(
    run_dir: Path | None,
    sinks: list[str],
    total_steps: int,
    config: Mapping[str, Any] | None = None,
    *,
    health: HealthConfig | None = None,
    resume_step: int | None = None,
    samples_every: int = 10,
    samples_prompts: int = 4,
    console_every: int = 10,
    project: str | None = None,
    run_name: str | None = None,
) -> Recorder:
    """Build the recorder of a run.

    Args:
        run_dir: where metrics.jsonl, samples.jsonl and health.jsonl go (None: no files, e.g. tests).
        sinks: names from SINKS, e.g. ["console", "tensorboard"]; "jsonl" may be listed but is implied.
        total_steps: the run's number of optimizer steps (progress bar and ETA).
        config: the fully resolved run config as a plain dict, attached to tracker runs as parameters.
        health: thresholds of the health monitors (None: defaults; `HealthConfig(enabled=False)`: off).
        resume_step: when resuming from the checkpoint of this step, drop records of later steps from
            the existing files and append after them, so the files equal those of an unbroken run.
        samples_every, samples_prompts: see Recorder.
        console_every: without a terminal, the console prints one line per this many steps.
        project, run_name: names for tracker runs (default "grpokit" and the run directory's name).
    """
    unknown = [s for s in sinks if s != "jsonl" and s not in SINKS]
    if unknown:
        raise ValueError(f"unknown recorder sink(s) {unknown}; valid names are {['jsonl', *SINKS]}")
    built: list[Sink] = []
    if run_dir is not None:
        built.append(JsonlSink(Path(run_dir), resume_step=resume_step))
    options = {
        "console_every": console_every,
        "project": project or "grpokit",
        "run_name": run_name or (Path(run_dir).name if run_dir is not None else None),
    }
    try:
        for name in dict.fromkeys(s for s in sinks if s != "jsonl"):  # de-duplicated, order kept
            built.append(SINKS[name](run_dir, total_steps, dict(config or {}), resume_step, **options))
    except BaseException:
        for sink in built:  # don't leave a live progress bar or open files behind
            sink.close()
        raise
    monitor = health_monitor(health or HealthConfig(), dict(config or {}), run_dir)
    if run_dir is not None and resume_step is not None:  # the monitors continue as if never stopped
        replay_history(monitor, Path(run_dir) / "metrics.jsonl")
    return Recorder(built, monitor, samples_every, samples_prompts)


def health_monitor(health: HealthConfig, config: dict[str, Any], run_dir: Path | None) -> HealthMonitor:
    """The live monitors of a run, with the doctor's checks on the run so far every `health.doctor_every`
    steps (its findings warned once; those a live monitor already watches are left to it)."""
    watch = None
    if health.enabled and health.doctor_every:
        watch = DoctorWatch(
            every=health.doctor_every,
            health=dataclasses.asdict(health),
            run_config=config,
            path=Path(run_dir) if run_dir is not None else Path("."),
            skip=LIVE_MONITORED,
        )
    return HealthMonitor(health, run_config=config, doctor=watch)


def replay_history(monitor: HealthMonitor, metrics_file: Path) -> None:
    """Feed a resumed run's kept metrics (already cut at the checkpoint) through the monitors, so
    their windows, run-level bests and already-given warnings are those of an unbroken run. What
    they observed then is each row without the `health/*` values they added; events are dropped
    (they are in health.jsonl already)."""
    if not metrics_file.is_file():
        return
    for line in metrics_file.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            monitor.observe({k: v for k, v in row.items() if k != "step" and not k.startswith("health/")}, row["step"])
