"""Optional experiment-tracker sinks: TensorBoard, Weights & Biases, MLflow, Trackio.

Each tracker is an optional extra (`pip install grpokit[wandb]` ...). Its package is imported only
when the sink is asked for, and a missing package is one clear sentence, not a traceback.

All of them work without a network:

- tensorboard: event files in RUN_DIR/tensorboard (`tensorboard --logdir RUN_DIR`).
- wandb: set WANDB_MODE=offline to keep the run in RUN_DIR/wandb (`wandb sync` uploads it later).
- mlflow: a local store in the run directory unless MLFLOW_TRACKING_URI says otherwise: RUN_DIR/mlflow.db
  (SQLite) with the full `mlflow` package, RUN_DIR/mlruns (file store) with `mlflow-skinny`
  (`mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db`).
- trackio: a local database in Trackio's cache directory (`trackio show`).

Trackers receive the same metrics dict as every sink; non-finite values are dropped (most trackers
reject or mis-plot them, and metrics.jsonl keeps them anyway). TensorBoard and W&B name them as
TRL's runs do there (transformers' callbacks prefix training logs with "train/"): "reward" becomes
"train/reward", "eval/accuracy" stays, so dashboards built for TRL runs find them. Samples are sent
as a text table where the tracker has one.

Under grpokit.trl the trackers are fed transformers' log entries instead (``log_entry``: each entry of
``trainer.state.log_history`` at TRL's step), named as transformers' integration callbacks name them:
TensorBoard, W&B and Trackio through ``rewrite_logs`` ("eval_loss" -> "eval/loss", "loss" ->
"train/loss"), W&B and Trackio with "train/global_step" and without the one-off totals of the final
entry (W&B keeps those in the run summary), MLflow under the entry's own keys.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpokit.version import installed

_EXTRA = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}


def missing_package(sink: str) -> str | None:
    """One sentence saying how to install the package tracker `sink` needs, or None when it is there
    (checked when the config is validated, before a run folder exists)."""
    if sink not in _EXTRA or importlib.util.find_spec(_EXTRA[sink]) is not None:
        return None
    return (
        f"the '{sink}' recorder sink needs the {_EXTRA[sink]} package, which is not installed: "
        f"pip install 'grpokit[{_EXTRA[sink]}]' (or remove '{sink}' from record.sinks)"
    )


def trl_name(key: str) -> str:
    """The tag TRL's TensorBoard and W&B logs use: "eval/..." as is, everything else under "train/"."""
    return key if key.startswith(("train/", "eval/")) else f"train/{key}"


def rewrite_logs(logs: Mapping[str, Any]) -> dict[str, Any]:
    """transformers' names for a log entry: "eval_x" -> "eval/x", "test_x" -> "test/x", anything else "train/x"."""
    out = {}
    for key, value in logs.items():
        if key.startswith("eval_"):
            out["eval/" + key[len("eval_") :]] = value
        elif key.startswith("test_"):
            out["test/" + key[len("test_") :]] = value
        else:
            out["train/" + key] = value
    return out


SINGLE_VALUE_SCALARS = (
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_loss",
    "total_flos",
)
"""The final entry's totals, which transformers' W&B callback puts in the run summary and Trackio's leaves out."""


def _series(logs: Mapping[str, Any], step: int) -> dict[str, float]:
    """W&B's and Trackio's row of a log entry: the totals left out, transformers' names, the step as
    "train/global_step"."""
    rest = {k: v for k, v in logs.items() if k not in SINGLE_VALUE_SCALARS}
    return {**finite_scalars(rewrite_logs(rest)), "train/global_step": float(step)}


def _require(module: str, sink: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if importlib.util.find_spec(module) is not None:  # installed: the error is from inside the package
            package = " ".join(filter(None, (_EXTRA[sink], installed(_EXTRA[sink]))))  # "wandb 0.22.0"
            raise ImportError(
                f"the '{sink}' recorder sink could not import the installed {package} ({type(e).__name__}: {e}); a "
                "version that does not fit this environment's other packages (such as protobuf) is the usual "
                f"cause: pip install -U 'grpokit[{_EXTRA[sink]}]' (or remove '{sink}' from the sink list)"
            ) from e
        raise ImportError(
            f"the '{sink}' recorder sink needs the {_EXTRA[sink]} package: pip install 'grpokit[{_EXTRA[sink]}]' "
            f"(or remove '{sink}' from the sink list)"
        ) from e


def finite_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics that are finite numbers, as floats (what trackers can plot)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        try:
            f = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out[key] = f
    return out


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"loss": {"beta": 0.0}} -> {"loss.beta": 0.0}: trackers' parameter tables are flat."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def samples_text(step: int, rows: list[dict[str, Any]]) -> str:
    """A markdown rendering of sample rows (TensorBoard's text plugin shows markdown)."""
    lines = [f"### step {step}"]
    for row in rows:
        lines.append(f"**prompt:** {row.get('prompt', '')}")
        for c in row.get("completions", []):
            lines.append(f"- reward {c.get('reward')}, advantage {c.get('advantage')}: {c.get('text', '')}")
    return "\n\n".join(lines)


class TensorBoardSink:
    """Event files in RUN_DIR/tensorboard, one per session of the run. A resumed session marks where it restarts
    (``restart_at``) before its first scalar, so TensorBoard drops what the abandoned session logged from that
    step on instead of drawing both (a zig-zag over the steps trained twice)."""

    name = "tensorboard"

    def __init__(self, run_dir: Path | None, config: Mapping[str, Any], resume_step: int | None = None) -> None:
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir or ".") / "tensorboard"))
        self.restart_at = None if resume_step is None else resume_step + 1
        """The first step a resumed session logs, in the steps this sink is given (grpokit's; grpokit.trl sets
        TRL's, which count updates); None for a fresh run or once marked."""
        if config:
            self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in flatten(config).items()), 0)

    def _mark_restart(self) -> None:
        """SummaryWriter's purge_step, written at the first scalar rather than at opening, when the steps are
        known: a SessionLog START at ``restart_at`` makes TensorBoard purge the earlier events at or after it.
        Twice: TensorBoard's server takes a run's first START as its opening, not a restart (an earlier session
        of grpokit's wrote none), while its event-file reader purges at each (the second purges nothing more)."""
        if self.restart_at is None:
            return
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        for _ in range(2):
            start = Event(step=self.restart_at, session_log=SessionLog(status=SessionLog.START))
            self.writer.file_writer.add_event(start)
        self.restart_at = None

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._mark_restart()
        for key, value in finite_scalars(metrics).items():
            self.writer.add_scalar(trl_name(key), value, step)

    def log_entry(self, logs: Mapping[str, Any], step: int) -> None:
        """A transformers log entry at ``step``, as its TensorBoardCallback writes it."""
        self._mark_restart()
        for key, value in finite_scalars(rewrite_logs(logs)).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.writer.add_text("train/samples", samples_text(step, rows), step)

    def warn(self, step: int, event: Any) -> None:
        self.writer.add_text(f"health/{getattr(event, 'monitor', 'note')}", getattr(event, "message", str(event)), step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    name = "wandb"

    def __init__(self, run_dir: Path | None, config: Mapping[str, Any], project: str, run_name: str | None) -> None:
        self.wandb = _require("wandb", "wandb")
        self.run = self.wandb.init(
            project=project, name=run_name, dir=str(run_dir) if run_dir else None, config=dict(config), reinit=True
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({trl_name(k): v for k, v in finite_scalars(metrics).items()}, step=step)

    def log_entry(self, logs: Mapping[str, Any], step: int) -> None:
        """A transformers log entry at ``step``, as its WandbCallback logs it (the totals in the summary)."""
        for key in SINGLE_VALUE_SCALARS:
            if key in logs:
                self.run.summary[key] = logs[key]
        self.run.log(_series(logs, step), step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        table = self.wandb.Table(columns=["step", "prompt", "completion", "reward", "advantage"])
        for row in rows:
            for c in row.get("completions", []):
                table.add_data(step, row.get("prompt", ""), c.get("text", ""), c.get("reward"), c.get("advantage"))
        self.run.log({"samples": table}, step=step)

    def warn(self, step: int, event: Any) -> None:
        self.wandb.termwarn(f"step {step}: {getattr(event, 'message', event)}")

    def close(self) -> None:
        self.run.finish()


def local_mlflow_uri(run_dir: Path) -> str:
    """A tracking URI inside the run directory.

    MLflow 3 recommends a SQLite store (needs sqlalchemy, which the full `mlflow` package brings) and
    refuses its old file store unless MLFLOW_ALLOW_FILE_STORE is set; `mlflow-skinny` has no sqlalchemy,
    so there we fall back to the file store and allow it, which every MLflow version can read.
    """
    import os

    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("sqlalchemy") is not None:
        return f"sqlite:///{run_dir / 'mlflow.db'}"
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return (run_dir / "mlruns").as_uri()


class MlflowSink:
    name = "mlflow"

    def __init__(self, run_dir: Path | None, config: Mapping[str, Any], project: str, run_name: str | None) -> None:
        import os

        self.mlflow = _require("mlflow", "mlflow")
        if "MLFLOW_TRACKING_URI" not in os.environ and run_dir is not None:
            self.mlflow.set_tracking_uri(local_mlflow_uri(Path(run_dir)))
        self.mlflow.set_experiment(project)
        self.run = self.mlflow.start_run(run_name=run_name)
        params = {k: str(v)[:500] for k, v in flatten(config).items()}  # MLflow caps parameter values
        if params:
            self.mlflow.log_params(params)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.mlflow.log_metrics(finite_scalars(metrics), step=step)

    def log_entry(self, logs: Mapping[str, Any], step: int) -> None:
        """A transformers log entry at ``step``, as its MLflowCallback logs it (characters MLflow refuses as _)."""
        import re

        metrics = {re.sub(r"[^0-9A-Za-z_\-\.\ :/]", "_", k): v for k, v in finite_scalars(logs).items()}
        self.mlflow.log_metrics(metrics, step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.mlflow.log_text(samples_text(step, rows), f"samples/step_{step:06d}.md")

    def warn(self, step: int, event: Any) -> None:
        self.mlflow.log_text(
            getattr(event, "message", str(event)), f"health/step_{step:06d}_{getattr(event, 'monitor', 'note')}.txt"
        )

    def close(self) -> None:
        self.mlflow.end_run()


class TrackioSink:
    name = "trackio"

    def __init__(self, run_dir: Path | None, config: Mapping[str, Any], project: str, run_name: str | None) -> None:
        self.trackio = _require("trackio", "trackio")
        self.trackio.init(project=project, name=run_name, config=dict(config))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.trackio.log(finite_scalars(metrics), step=step)

    def log_entry(self, logs: Mapping[str, Any], step: int) -> None:
        """A transformers log entry at ``step``, as its TrackioCallback logs it."""
        self.trackio.log(_series(logs, step), step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass  # kept in samples.jsonl; Trackio's tables are not needed for reading them

    def warn(self, step: int, event: Any) -> None:
        pass  # printed by the console sink and kept in health.jsonl

    def close(self) -> None:
        self.trackio.finish()


NAMED_RUNS = ("wandb", "mlflow", "trackio")
"""The trackers whose runs take record.project and record.run_name (make_tracker passes them); tensorboard's do not."""


def make_tracker(
    kind: str,
    run_dir: Path | None,
    config: Mapping[str, Any],
    project: str | None = None,
    run_name: str | None = None,
    resume_step: int | None = None,
) -> Any:
    """Build the tracker sink `kind` ("tensorboard", "wandb", "mlflow" or "trackio"); `resume_step`: the
    checkpoint's step when resuming, read by TensorBoard's sink (W&B and MLflow start a run of their own per
    session, so no run of theirs holds both an abandoned session's steps and the new one's)."""
    project = project or "grpokit"
    if kind == "tensorboard":
        return TensorBoardSink(run_dir, config, resume_step)
    if kind == "wandb":
        return WandbSink(run_dir, config, project, run_name)
    if kind == "mlflow":
        return MlflowSink(run_dir, config, project, run_name)
    if kind == "trackio":
        return TrackioSink(run_dir, config, project, run_name)
    raise ValueError(f"unknown tracker {kind!r}; valid: {sorted(_EXTRA)}")
