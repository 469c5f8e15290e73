"""Optional tracker sinks: clear error when missing, wiring via fakes, real offline runs when installed."""

from __future__ import annotations

import json
import math
import os
import subprocess
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


def test_an_installed_tracker_that_fails_to_import_is_named_as_installed(tmp_path: Path, monkeypatch) -> None:
    # seen 2026-11-30 with wandb 0.19-0.22 beside protobuf 7 (no protos for it): the sink said wandb was not
    # installed and told the user to install what they had; it now names the installed version and its error
    site = tmp_path / "site"
    (site / "wandb").mkdir(parents=True)
    (site / "wandb" / "__init__.py").write_text("from wandb.proto import Imports\n")
    (site / "wandb" / "proto.py").write_text("")
    (site / "wandb-0.22.0.dist-info").mkdir()
    (site / "wandb-0.22.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: wandb\nVersion: 0.22.0\n")
    monkeypatch.syspath_prepend(str(site))
    for name in [m for m in sys.modules if m == "wandb" or m.startswith("wandb.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError) as e:
        make_recorder(tmp_path / "run", ["wandb"], total_steps=2)
    assert str(e.value) == (
        "the 'wandb' recorder sink could not import the installed wandb 0.22.0 (ImportError: cannot import name "
        "'Imports' from 'wandb.proto' (" + str(site / "wandb" / "proto.py") + ")); a version that does not fit this "
        "environment's other packages (such as protobuf) is the usual cause: pip install -U 'grpokit[wandb]' (or "
        "remove 'wandb' from the sink list)"
    )


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


# The real packages live in $VENV/tracker-site (scripts/install_test_deps.sh), off every other process's path:
# each test logs a little through grpokit's recorder in a subprocess that has them, then reads back what the
# package itself stored.
TRACKER_SITE = Path(sys.prefix) / "tracker-site"
LOG_A_BIT = """
import json, math, sys
from pathlib import Path
from grpokit.record import make_recorder
run, sink = Path(sys.argv[1]), sys.argv[2]
rec = make_recorder(run, [sink], total_steps=2, config=json.loads(sys.argv[3]))
rec.log({"reward": 0.5, "kl": 0.01, "loss": math.nan}, 1)
rec.log({"reward": 0.7, "kl": 0.02, "loss": 0.1}, 2)
rec.log_samples(10, [{"prompt": "p", "completions": [{"text": "t", "reward": 1.0, "advantage": 0.5}]}])
rec.warn(2, "something to look at")
rec.close()
"""


def _log_with_the_real_package(package: str, sink: str, run: Path, env: dict[str, str | None]) -> dict[str, str]:
    """Log a little through `sink` in a subprocess that has the real package; env values of None are unset."""
    if not (TRACKER_SITE / package).is_dir():
        pytest.skip(f"{package} is not in {TRACKER_SITE} (bash scripts/install_test_deps.sh installs it)")
    merged = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([*sys.path, str(TRACKER_SITE)])}
    env = {k: v for k, v in merged.items() if v is not None}
    done = subprocess.run(
        [sys.executable, "-c", LOG_A_BIT, str(run), sink, json.dumps(CONFIG)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return env


def test_wandb_offline(tmp_path: Path) -> None:
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path)}
    env = _log_with_the_real_package("wandb", "wandb", tmp_path, env)
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    # The run's history as wandb stored it: a ".wandb" file is a 7-byte header (":W&B", magic, version)
    # then LevelDB-log records (32 KiB blocks; 7-byte record header: crc, length, type 1 full / 2 first /
    # 3 middle / 4 last) holding wandb's own protobuf Records.
    read = """
import json, struct, sys
from wandb.proto import wandb_internal_pb2
data, pos, rows, part = open(sys.argv[1], "rb").read(), 7, [], b""
assert data[:4] == b":W&B", data[:7]
while pos + 7 <= len(data):
    if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
        pos += 32768 - pos % 32768
        continue
    length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
    part, pos = part + data[pos + 7 : pos + 7 + length], pos + 7 + length
    if kind in (1, 4):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(part)
        part = b""
        if rec.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
print(json.dumps(rows))
"""
    (log,) = offline.glob("*.wandb")
    done = subprocess.run([sys.executable, "-c", read, str(log)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout)
    steps = {r["_step"]: r for r in rows if "train/reward" in r}  # TRL's names (transformers' wandb callback)
    assert {s: r["train/reward"] for s, r in steps.items()} == {1: 0.5, 2: 0.7}
    assert "train/loss" not in steps[1] and steps[2]["train/loss"] == 0.1  # a NaN is dropped for the tracker
    assert steps[1]["train/health/nonfinite"] == 1  # and the health monitor's flag says so
    (table,) = offline.glob("files/media/table/samples_*.table.json")
    assert json.loads(table.read_text())["data"] == [[10, "p", "t", 1.0, 0.5]]


def test_mlflow_local_file_store(tmp_path: Path) -> None:
    env = _log_with_the_real_package("mlflow", "mlflow", tmp_path, {"MLFLOW_TRACKING_URI": None})
    read = """
import json, sys
from pathlib import Path
import mlflow
from grpokit.record.trackers import local_mlflow_uri
client = mlflow.tracking.MlflowClient(tracking_uri=local_mlflow_uri(Path(sys.argv[1])))
(run,) = client.search_runs([client.get_experiment_by_name("grpokit").experiment_id])
reward = [m.value for m in client.get_metric_history(run.info.run_id, "reward")]
print(json.dumps({"beta": run.data.params["loss.beta"], "reward": reward}))
"""
    done = subprocess.run(
        [sys.executable, "-c", read, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"beta": "0.04", "reward": [0.5, 0.7]}


def test_a_resumed_runs_tensorboard_shows_each_step_once(tmp_path: Path) -> None:
    """Session 1 logs reward 0.0 at steps 1-8 and dies; session 2 resumes from the checkpoint of step 4 and logs
    1.0 at steps 5-8. TensorBoard's event-file reader and its server's (plugin_event_accumulator: a run's first
    SessionLog START is its opening, so the sink writes two) both show 0.0 at 1-4 and 1.0 at 5-8, each step once,
    and so does the doctor's reader; without the restart mark they showed steps 5-8 twice (a zig-zag)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    from grpokit.record.run_readers import load_any

    for resume, steps, value in ((None, range(1, 9), 0.0), (4, range(5, 9), 1.0)):
        rec = make_recorder(tmp_path, ["tensorboard"], total_steps=8, config=CONFIG, resume_step=resume)
        for s in steps:
            rec.log({"reward": value}, s)
        rec.close()
    want = [(1, 0.0), (2, 0.0), (3, 0.0), (4, 0.0), (5, 1.0), (6, 1.0), (7, 1.0), (8, 1.0)]
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/reward")] == want
    served = plugin_event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    served.Reload()
    assert [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in served.Tensors("train/reward")] == want
    run, _ = load_any(tmp_path / "tensorboard")
    assert [(r["step"], r["reward"]) for r in run.metrics] == want
