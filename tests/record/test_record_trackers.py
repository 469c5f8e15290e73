"""Optional tracker sinks: clear error when missing, wiring via fakes, real offline runs when installed."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from grpokit.record import make_recorder
from grpokit.record.trackers import finite_scalars, flatten

CONFIG = {"model": "tiny", "loss": {"beta": 0.04, "epsilon": 0.2}}


def _log_a_bit(rec: Any) -> None:
    rec.log({"reward": 0.5, "kl": 0.01, "loss": math.nan}, 1)
    rec.log({"reward": 0.7, "kl": 0.02, "loss": 0.1}, 2)
    rec.log_samples(10, [{"prompt": "p", "completions": [{"text": "t", "reward": 1.0, "advantage": 0.5}]}])
    rec.warn(2, "something to look at")
    rec.close()


def test_helpers() -> None:
    assert flatten(CONFIG) == {"model": "tiny", "loss.beta": 0.04, "loss.epsilon": 0.2}
    assert finite_scalars({"a": 1, "b": math.nan, "c": "text", "d": math.inf}) == {"a": 1.0}


@pytest.mark.parametrize("sink", ["wandb", "mlflow", "trackio", "tensorboard"])
def test_missing_package_is_one_clear_sentence(sink: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, sink, None)  # makes `import sink` raise ImportError
    with pytest.raises(ImportError, match=rf"the '{sink}' recorder sink needs .* pip install 'grpokit\[{sink}\]'"):
        make_recorder(tmp_path, [sink], total_steps=2)


def test_trackio_wiring_with_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []
    fake = types.ModuleType("trackio")
    fake.init = lambda **kw: calls.append(("init", kw))  # type: ignore[attr-defined]
    fake.log = lambda metrics, step=None: calls.append(("log", (metrics, step)))  # type: ignore[attr-defined]
    fake.finish = lambda: calls.append(("finish", None))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trackio", fake)
    _log_a_bit(make_recorder(tmp_path / "run7", ["trackio"], total_steps=2, config=CONFIG))
    assert calls[0] == ("init", {"project": "grpokit", "name": "run7", "config": CONFIG})
    # The NaN loss is dropped for the tracker; the health monitor flags the step.
    assert calls[1] == ("log", ({"reward": 0.5, "kl": 0.01, "health/nonfinite": 1.0}, 1))
    assert calls[-1] == ("finish", None)


def test_tensorboard_writes_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_a_bit(make_recorder(tmp_path, ["tensorboard"], total_steps=2, config=CONFIG))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    # TRL's tags (transformers' TensorBoard callback): training logs under train/, eval/ as is
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("train/reward")] == [(1, 0.5), (2, 0.7)]
    assert [e.step for e in acc.Scalars("train/loss")] == [2]  # the NaN step is left out
    assert "reward" not in acc.Tags()["scalars"]


def test_trl_names() -> None:
    from grpokit.record.trackers import trl_name

    assert trl_name("reward") == "train/reward"
    assert trl_name("rewards/likes_a/mean") == "train/rewards/likes_a/mean"
    assert trl_name("eval/accuracy") == "eval/accuracy" and trl_name("train/x") == "train/x"


def test_missing_tracker_package_stops_the_cli_before_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from grpokit.cli import main

    monkeypatch.setitem(sys.modules, "wandb", None)  # importlib.util.find_spec("wandb") is then None
    run = tmp_path / "run"
    assert main(["train", "record.sinks=[console,wandb]", "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "grpokit: error: record.sinks: the 'wandb' recorder sink needs the wandb package, which is not "
        "installed: pip install 'grpokit[wandb]' (or remove 'wandb' from record.sinks)"
    )
    assert not run.exists()
    assert main(["train", "record.sinks=[tensorbord]", "--out", str(run)]) == 2  # a typo: the valid names
    assert (
        "record.sinks='tensorbord' is not valid; choose one of: jsonl, console, tensorboard" in capsys.readouterr().err
    )
    assert not run.exists()


def test_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    _log_a_bit(make_recorder(tmp_path, ["wandb"], total_steps=2, config=CONFIG))
    assert list((tmp_path / "wandb").glob("offline-run-*")), "no offline run directory written"


def test_mlflow_local_file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _log_a_bit(make_recorder(tmp_path, ["mlflow"], total_steps=2, config=CONFIG))
    from grpokit.record.trackers import local_mlflow_uri

    client = mlflow.tracking.MlflowClient(tracking_uri=local_mlflow_uri(tmp_path))
    (run,) = client.search_runs([client.get_experiment_by_name("grpokit").experiment_id])
    assert run.data.params["loss.beta"] == "0.04"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "reward")] == [0.5, 0.7]
