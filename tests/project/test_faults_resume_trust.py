"""Resume trusts only what verifies (issue 48): config.yaml and config_history.yaml carry a checksum
of themselves, a checkpoint whose manifest went missing is never completed with a fresh optimizer,
and a run folder from before checksums and manifests is read as it is, said once. Tiny runs of the
demo model through ``grpokit train``, in process."""

import json

import yaml

from grpokit.cli import main
from grpokit.config.io import SEAL
from grpokit.train import checkpoint
from helpers import faults_runs
from helpers.faults_runs import last_error, steps_in, train

workdir = faults_runs.workdir  # the fixture


def test_a_config_yaml_cut_five_bytes_short_is_refused_naming_it(workdir, capsys):
    assert train("train.steps=1", "--out", "run") == 0
    cfg = workdir / "run" / "config.yaml"
    text = cfg.read_text()
    assert text.startswith(SEAL)
    # cut short and still YAML (the reported case: 5 bytes, the last list item becoming a shorter word); the
    # shortest such cut of at least 5 bytes, whatever field the config now ends with
    cfg.write_text(next(text[:-k] for k in range(5, len(text)) if _is_yaml(text[:-k])))
    assert main(["train", "--resume", "run", "train.steps=2"]) == 2
    assert last_error(capsys) == (
        "grpokit: error: 'run/config.yaml' does not match the sha256 on its first line, so it is torn or damaged "
        "(or was edited by hand); restore it from a copy (to keep a deliberate edit, delete that first line) "
        "before resuming"
    )
    assert steps_in(workdir / "run") == [1]


def test_a_damaged_history_is_refused_and_a_whole_one_applies(workdir, capsys):
    assert train("train.steps=1", "--out", "run") == 0
    assert main(["train", "--resume", "run", "train.steps=2"]) == 0
    hist = workdir / "run" / "config_history.yaml"
    text = hist.read_text()
    assert text.startswith(SEAL) and yaml.safe_load(text)[0]["changed"]["train.steps"] == {"from": 1, "to": 2}
    hist.write_text(text.replace("to: 2", "to: 3"))  # a flipped byte that is still valid YAML
    assert main(["train", "--resume", "run"]) == 2
    assert "'run/config_history.yaml' does not match the sha256 on its first line" in last_error(capsys)


def test_a_config_from_before_checksums_is_read_and_said_so_once(workdir, capsys):
    assert train("train.steps=1", "--out", "run") == 0
    cfg = workdir / "run" / "config.yaml"
    cfg.write_text(cfg.read_text().split("\n", 1)[1])  # as grpokit wrote it before checksums
    capsys.readouterr()
    assert main(["train", "--resume", "run", "train.steps=2"]) == 0
    out = capsys.readouterr().out
    assert out.count("run/config.yaml has no checksum line") == 1
    assert steps_in(workdir / "run") == [1, 2]


def _drop(ckpt, *names):
    for n in names:
        (ckpt / n).unlink()


def test_a_checkpoint_without_its_manifest_and_optimizer_falls_back_to_the_intact_one(workdir, capsys):
    # the case: "resuming with ... a fresh optimizer" though save_only_model was false
    assert train("train.steps=2", "--out", "run") == 0
    run = workdir / "run"
    _drop(run / "checkpoints" / "step-000002", "optimizer.pt", "manifest.json")
    capsys.readouterr()
    assert main(["train", "--resume", "run", "train.steps=3"]) == 0
    out = capsys.readouterr().out
    assert (
        "skipping checkpoint run/checkpoints/step-000002 because its manifest.json is missing (every save writes "
        "it last), so its files cannot be trusted" in out
    )
    assert "grpokit: resuming from run/checkpoints/step-000001, the newest checkpoint that verifies whole" in out
    assert "fresh optimizer" not in out
    assert steps_in(run) == [1, 2, 3]
    assert checkpoint.verify(run / "checkpoints" / "step-000003") is None


def test_the_only_checkpoint_without_its_manifest_is_refused_not_completed(workdir, capsys):
    assert train("train.steps=1", "--out", "run") == 0
    _drop(workdir / "run" / "checkpoints" / "step-000001", "manifest.json")
    assert main(["train", "--resume", "run", "train.steps=2"]) == 2
    assert "has no complete checkpoint under checkpoints/ that verifies" in last_error(capsys)
    assert (workdir / "run" / "checkpoints" / "step-000001" / "optimizer.pt").is_file()  # nothing deleted


def _as_before_manifests(ckpt):
    """A checkpoint as grpokit wrote them before manifests: no manifest.json, trainer_state without the mark."""
    (ckpt / "manifest.json").unlink()
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state.pop("manifest")
    (ckpt / "trainer_state.json").write_text(json.dumps(state))


def test_checkpoints_from_before_manifests_resume_whole_and_a_partial_one_is_skipped(workdir, capsys):
    assert train("train.steps=2", "--out", "run") == 0
    ckpts = workdir / "run" / "checkpoints"
    for p in ckpts.iterdir():
        _as_before_manifests(p)
    _drop(ckpts / "step-000002", "optimizer.pt")  # partial: never completed with a fresh optimizer
    capsys.readouterr()
    assert main(["train", "--resume", "run", "train.steps=3"]) == 0
    out = capsys.readouterr().out
    assert "skipping checkpoint run/checkpoints/step-000002 because it has no manifest.json and optimizer.pt" in out
    assert "checkpoint run/checkpoints/step-000001 has no manifest.json (written by a grpokit from before" in out
    assert steps_in(workdir / "run") == [1, 2, 3]


def test_a_model_only_run_resumes_its_model_only_checkpoint(workdir, capsys):
    assert train("train.steps=1", "train.save_only_model=true", "--out", "run") == 0
    ckpt = workdir / "run" / "checkpoints" / "step-000001"
    assert json.loads((ckpt / "manifest.json").read_text())["model_only"] is True
    assert checkpoint.verify(ckpt) is None
    _as_before_manifests(ckpt)
    assert checkpoint.verify(ckpt).endswith("though the run did not ask for model-only saves (train.save_only_model)")
    assert checkpoint.verify(ckpt, model_only_ok=True) is None
    assert main(["train", "--resume", "run", "train.steps=2"]) == 0
    assert steps_in(workdir / "run") == [1, 2]


def test_a_torn_summary_is_refused_naming_it(workdir, capsys):
    assert train("train.steps=1", "--out", "run") == 0
    (workdir / "run" / "summary.json").write_text('{"steps": 1, "rew')
    assert main(["train", "--resume", "run", "train.steps=2"]) == 2
    assert last_error(capsys).startswith("grpokit: error: 'run/summary.json' is torn or damaged")


def _is_yaml(text: str) -> bool:
    try:
        yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return True
