"""Faults of the user's files or the machine are named by cause and place, never
"an internal fault". Each case ended with "an internal fault stopped the run (SafetensorError ...)"
or another library's words before; all run on real files, and the full disk on a real 7 MB tmpfs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from grpokit.cli import main

FAST = [
    "train.steps=1",
    "record.report=false",
    "rollout.max_new_tokens=4",
    "train.prompts_per_step=2",
    "rollout.group_size=2",
    "record.sinks=[]",
    "train.threads=1",
]


def _assets() -> Path:
    import grpokit.data.tasks as tasks

    return Path(tasks.__file__).parent / "assets"


def _last_error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.fixture
def truncated(tmp_path) -> Path:
    model = tmp_path / "truncated-model"
    shutil.copytree(_assets() / "demo-model", model)
    weights = model / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    return model


def test_a_truncated_model_is_named_by_eval_and_train(truncated, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--model", str(truncated), "--limit", "2"]) == 2
    msg = _last_error(capsys)
    assert msg == (
        f"grpokit: error: the weights of model.name_or_path='{truncated}' in {truncated} are damaged or "
        "truncated (Error while deserializing header: incomplete metadata, file not fully covered); copy or "
        "download the model again"
    )
    assert main(["train", f"model.name_or_path={truncated}", "data.task=arithmetic", *FAST, "--out", "run"]) == 2
    assert _last_error(capsys) == msg


def test_a_folder_that_is_not_a_model_is_named_by_eval(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.md").write_text("not a model")
    assert main(["eval", "--model", str(notes), "--limit", "2"]) == 2
    assert _last_error(capsys) == (
        f"grpokit: error: model.name_or_path='{notes}' is a folder without config.json "
        f"({notes}), so not a Hugging Face model folder; give a model folder, a checkpoint, "
        "a hub id or demo"
    )


def test_resume_with_another_model_is_refused_naming_both_and_other_weights_at_its_path_too(
    tmp_path, capsys, monkeypatch
):
    """A resume naming another model (before: accepted when its shape fit, the KL reference and tokenizer silently
    the new model's while the policy stayed the checkpoint's) is refused before any model is loaded, naming both;
    the same folder written another way is the same model; another model copied to the run's path is caught by the
    checkpoint's weights."""
    monkeypatch.chdir(tmp_path)
    model, other = tmp_path / "model", _assets() / "calc-demo-model"  # same architecture, another vocabulary
    shutil.copytree(_assets() / "demo-model", model)
    assert main(["train", f"model.name_or_path={model}", "data.task=arithmetic", *FAST, "--out", "run"]) == 0
    assert main(["train", "--resume", "run", "train.steps=2", f"model.name_or_path={other}"]) == 2
    assert _last_error(capsys) == (
        f"grpokit: error: model.name_or_path was '{model}' when the run in 'run' was trained and is '{other}' now, "
        "so the resumed run would train something else: the policy comes from its checkpoint, but its KL reference, "
        "tokenizer and (LoRA) base model would come from the new model; resume with "
        f"model.name_or_path='{model}' (a model moved since: make its old path lead to it), or start a new run from "
        "the checkpoint's weights (model.name_or_path=<checkpoint>/model)"
    )
    assert main(["train", "--resume", "run", "train.steps=2", f"model.name_or_path={tmp_path}/./model/"]) == 0
    shutil.rmtree(model)
    shutil.copytree(other, model)  # another model where the run's was: its weights do not fit the checkpoint's
    assert main(["train", "--resume", "run", "train.steps=3"]) == 2
    msg = _last_error(capsys)
    assert msg.startswith(
        "grpokit: error: checkpoint run/checkpoints/step-000002 holds the weights of another model "
        "than the one loaded (size mismatch for model.embed_tokens.weight"
    ), msg
    assert msg.endswith(
        "resume with the model the run was trained with (model.name_or_path in run/config.yaml) or start a new run"
    )
    assert "internal fault" not in msg


@pytest.fixture
def small_disk(tmp_path):
    """A real 7 MB filesystem (tmpfs; root only), unmounted after the test."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=7m", "tmpfs", str(mnt)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_real_full_disk_names_the_checkpoint_it_could_not_write(small_disk, capsys, tmp_path, monkeypatch):
    # the checkpoints of the demo (~3 MB each with the optimizer) fill 7 MB at the third save; safetensors
    # reports it as SafetensorError(... os error 28), which ended as "an internal fault" before
    monkeypatch.chdir(tmp_path)
    run = small_disk / "run"
    code = main(["train", *FAST, "train.steps=6", "train.save_every=1", "train.keep_checkpoints=3", "--out", str(run)])
    msg = _last_error(capsys)
    assert code == 1, msg
    saved = sorted(p.name for p in (run / "checkpoints").iterdir())
    failed = f"step-{int(saved[-1][5:]) + 1:06d}"
    assert msg == (
        f"grpokit: error: the run stopped because writing {run}/checkpoints/{failed} failed (No space left on "
        f"device); checkpoint {run}/checkpoints/{saved[-1]} kept; continue with: grpokit train --resume {run} "
        "once space is free"
    )


def test_torch_and_safetensors_writes_on_a_full_disk_become_storage_errors(small_disk):
    import torch
    from safetensors.torch import save_file

    from grpokit.train.faults import classify, storage_error

    (small_disk / "fill").write_bytes(b"\0" * (7 * 2**20 - 200_000))
    for write in (
        lambda p: torch.save({"a": torch.zeros(600_000)}, p),  # RuntimeError: "... unexpected pos ..."
        lambda p: save_file({"a": torch.zeros(600_000)}, str(p)),
    ):  # SafetensorError: "... os error 28"
        target = small_disk / "out"
        with pytest.raises(Exception) as err:
            write(target)
        e = storage_error(err.value, target)
        assert isinstance(e, OSError) and e.errno == 28 and e.filename == str(target)
        target.unlink(missing_ok=True)
    assert classify(err.value).status == 1


def test_classify_by_cause_and_a_bug_stays_internal(tmp_path):
    from grpokit.train.faults import classify

    missing = tmp_path / "nope.txt"
    try:
        missing.read_text()
    except FileNotFoundError as e:
        assert classify(e).sentence == f"{missing} does not exist; give a path to an existing file or folder"
    locked = tmp_path / "locked"
    locked.mkdir()
    try:
        raise RuntimeError("writer failed") from PermissionError(13, "Permission denied", str(locked / "x"))
    except RuntimeError as e:
        assert classify(e).sentence.startswith(f"permission denied on {locked / 'x'}")
    try:
        raise MemoryError()
    except MemoryError as e:
        assert classify(e).status == 1 and "ran out of memory" in classify(e).sentence
    assert classify(KeyError("step")) is None and classify(RuntimeError("shape mismatch in the loss")) is None
