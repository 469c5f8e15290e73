"""Which checkpoint of a run `grpokit eval` reads, and that it says so: the rule `--resume` follows
(train/run_checkpoints.py). Before, eval took the newest checkpoint folder without checking it against its
manifest (a checkpoint whose weights no longer matched their sha256 was evaluated with exit 0, while --resume
skipped it as damaged) and its result named only the run folder."""

import json

import pytest

from grpokit.cli import main
from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.train import Trainer

EVAL = ["--limit", "2", "--k", "1", "--max-new-tokens", "4"]


@pytest.fixture(scope="module")
def damaged_run(tmp_path_factory):
    """A 2-step demo run with a checkpoint at each step, the newest one's weights altered after the save."""
    out = tmp_path_factory.mktemp("eval-ckpt") / "run"
    cfg = Config()
    apply_overrides(
        cfg,
        [
            "train.steps=2",
            "train.save_every=1",
            "train.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
            "data.eval_size=0",
            "record.sinks=[]",
            "record.report=false",
            "train.threads=1",
            f"train.out={out}",
        ],
    )
    Trainer(cfg, quiet=True).train()
    weights = out / "checkpoints" / "step-000002" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8] ^= 0x01  # one bit of the last tensor: the file keeps its size, not its sha256
    weights.write_bytes(bytes(data))
    return out


def test_eval_of_a_run_reads_its_newest_checkpoint_that_verifies_and_names_it(damaged_run, capsys):
    assert main(["eval", "--model", str(damaged_run), "--json", *EVAL]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)  # stdout is the JSON alone: the skip is said on stderr
    assert (result["model"], result["checkpoint"], result["step"]) == (
        str(damaged_run),
        str(damaged_run / "checkpoints" / "step-000001"),
        1,
    )
    assert (
        f"grpokit: warning: skipping checkpoint {damaged_run}/checkpoints/step-000002 because "
        "model/model.safetensors does not match its sha256 in the manifest; trying the one before it"
    ) in captured.err
    assert f"grpokit: evaluating {damaged_run}/checkpoints/step-000001, the newest checkpoint that verifies whole" in (
        captured.err
    )
    assert main(["eval", "--model", str(damaged_run), *EVAL]) == 0
    assert f"{damaged_run}/checkpoints/step-000001 (step 1) on task arithmetic" in capsys.readouterr().out


def test_a_damaged_checkpoint_named_is_refused_by_eval_and_as_a_model_to_train(damaged_run, capsys, tmp_path):
    ckpt = damaged_run.resolve() / "checkpoints" / "step-000002"
    for name in (ckpt, ckpt / "model"):
        assert main(["eval", "--model", str(name), *EVAL]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"grpokit: error: the checkpoint to evaluate, '{ckpt}', is damaged (model/model.safetensors does not "
            "match its sha256 in the manifest); name another checkpoint, or the run folder to evaluate its newest "
            "one that verifies"
        )
    assert main(["train", f"model.name_or_path={ckpt / 'model'}", "--out", str(tmp_path / "new")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"grpokit: error: the checkpoint to load, '{ckpt}', is damaged (model/model.safetensors does not match its "
        "sha256 in the manifest); name another checkpoint, or another model folder"
    )
    whole = damaged_run / "checkpoints" / "step-000001" / "model"
    assert main(["eval", "--model", str(whole), "--json", *EVAL]) == 0  # a checkpoint that verifies: that one
    result = json.loads(capsys.readouterr().out)
    assert (result["checkpoint"], result["step"]) == (str(whole.parent.resolve()), 1)


def test_vllm_serve_refuses_a_damaged_checkpoint(damaged_run, capsys, monkeypatch):
    """`grpokit vllm-serve RUN/checkpoints/step-N/model` reads a run's weights too: the same rule."""
    from grpokit.rollout import vllm_serve

    ran = []
    monkeypatch.setattr(vllm_serve, "installed_vllm", lambda: "0.33.0")
    monkeypatch.setattr(vllm_serve, "preflight", lambda model, args: None)  # no port taken by the test
    monkeypatch.setattr(vllm_serve.os, "execve", lambda path, argv, env: ran.append(argv))
    ckpt = damaged_run.resolve() / "checkpoints" / "step-000002"
    assert main(["vllm-serve", str(ckpt / "model")]) == 2 and not ran
    assert "grpokit: error: the checkpoint to load, " in capsys.readouterr().err
    assert main(["vllm-serve", str(damaged_run / "checkpoints" / "step-000001" / "model")]) == 0 and len(ran) == 1
