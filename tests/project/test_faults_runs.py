"""The fault suite, run folders and user mistakes (docs/FAULTS.md): every mistake ends in
one sentence and a non-zero exit from `grpokit` (the traceback only with --debug), and a run
folder is never lost: checkpoints verify against their manifest, resume falls back past a damaged
one, a torn config is refused, changes at resume go to config_history.yaml, an occupied folder is
refused, interrupted saves are cleaned and a full disk stops the run with the previous checkpoint
intact. Tiny runs of the 0.26M demo model, in process (a few seconds each)."""

import errno
import json

import pytest
import torch
import yaml

from grpokit.cli import main
from grpokit.cli.app import COMMANDS
from grpokit.config.sections import ConfigError
from grpokit.record import jsonl
from grpokit.rewards.spec import RewardError
from grpokit.train import checkpoint
from helpers import faults_runs
from helpers.faults_runs import BASE, last_error, raise_as_grpokit, steps_in, train
from helpers.train_processes import grpokit_train

workdir = faults_runs.workdir  # the fixture

# ------------------------------------------------------------------ user mistakes: one sentence, no traceback


def test_health_window_zero_is_one_sentence_not_a_zero_division(workdir, capsys):
    assert train("health.window=0", "--out", "run") == 2
    assert last_error(capsys) == "grpokit: error: health.window must be a positive integer, got 0"


def test_a_typo_in_reward_params_is_refused(workdir, capsys):
    # repetition_penalty takes ngram_size; "ngram_sise" would be swallowed by its **kwargs (the dataset columns)
    assert train("reward.functions=[repetition_penalty]", "reward.params={repetition_penalty: {ngram_sise: 2}}") == 2
    err = last_error(capsys)
    assert "reward.params.repetition_penalty has 'ngram_sise'" in err and "ngram_size" in err
    # params keyed by a function that is not configured (a typo in its name)
    assert train("reward.params={repetion_penalty: {ngram_size: 2}}") == 2
    assert "reward.params names 'repetion_penalty', which is not in reward.functions" in last_error(capsys)


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("latin1.jsonl", b'{"question": "caf\xe9", "solution": "1"}\n', "is not UTF-8 text (byte 0xe9 on line 1)"),
        (  # Notepad's "Unicode": UTF-16 with its byte-order mark, named
            "utf16.jsonl",
            '{"question": "1+1=", "solution": "2"}\n'.encode("utf-16"),
            "'utf16.jsonl' is UTF-16 text (it starts with a UTF-16 byte-order mark), not UTF-8; save it as UTF-8",
        ),
        (
            "utf32.csv",
            "question,solution\n1+1=,2\n".encode("utf-32"),
            "'utf32.csv' is UTF-32 text (it starts with a UTF-32 byte-order mark), not UTF-8",
        ),
        ("empty.jsonl", b"", "is empty; it needs at least one row"),
        (
            "ragged.csv",
            b"question,solution\n1+1=,2\n2+2=,4,9\n",
            "row 3 of data file 'ragged.csv' has 3 fields but the header has 2",
        ),
        (
            "ragged.jsonl",
            b'{"question": "a", "solution": "1"}\n[1, 2]\n',
            "line 2 of data file 'ragged.jsonl' is a JSON list",
        ),
        (
            "torn.jsonl",
            b'{"question": "a", "solution": "1"}\n{"question": "b", "sol\n',
            "line 2 of data file 'torn.jsonl' is not valid JSON",
        ),
        (
            "noprompt.jsonl",
            b'{"question": "a", "solution": "1"}\n{"solution": "2"}\n',
            "row 2 of 'noprompt.jsonl' has no value in the prompt column 'question'",
        ),
    ],
)
def test_a_malformed_data_file_is_one_sentence_naming_the_line(workdir, capsys, name, content, expected):
    (workdir / name).write_bytes(content)
    assert train(data=name) == 2
    assert expected in last_error(capsys)


def test_out_naming_an_existing_file_is_refused(workdir, capsys):
    assert train("--out", "train.jsonl") == 2
    assert "train.out='train.jsonl' is an existing file, not a folder" in last_error(capsys)
    assert (workdir / "train.jsonl").read_text().startswith("{")  # untouched


def test_debug_shows_the_traceback(workdir, monkeypatch, capsys):
    with pytest.raises(ConfigError, match="health.window"):
        main(["--debug", "train", "health.window=0"])
    monkeypatch.setenv("GRPOKIT_DEBUG", "1")
    with pytest.raises(ConfigError, match="health.window"):
        main(["train", "health.window=0"])


def test_an_internal_fault_is_one_sentence_and_exit_1(workdir, monkeypatch, capsys):
    def broken(argv):
        raise_as_grpokit(RuntimeError("the bug\nsecond line"))

    monkeypatch.setitem(COMMANDS, "presets", broken)
    assert main(["presets"]) == 1
    assert last_error(capsys) == (
        "grpokit: error: an internal fault stopped the command (RuntimeError: the bug); "
        "run it again with --debug for the traceback"
    )
    with pytest.raises(RuntimeError):
        main(["presets", "--debug"])


# ------------------------------------------------------------------ untrusted rewards, as a user meets them


def test_a_hanging_reward_in_the_default_mode_times_out_and_the_command_exits(workdir):
    # with num_workers=0 (the default) a call that is not stopped keeps 2 steps of the demo from finishing
    # and the process from exiting. Every call is stopped at reward.timeout_s=0.5 and counted; 2 steps of
    # 2 prompts x 2 completions = 4 group calls, each then retried one completion at a time (4 x 2 more)
    args = [
        "data.dataset=train.jsonl",
        *BASE,
        "train.steps=2",
        "reward.functions=[faultrew:hangs]",
        "reward.timeout_s=0.5",
        "reward.max_failure_fraction=1.0",
        "--out",
        "run",
    ]
    out = grpokit_train(args, workdir)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(l) for l in (workdir / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rewards/hangs/timeouts"] for r in rows] == [4.0, 4.0]  # every completion, every step
    assert [r["rewards/hangs/failures"] for r in rows] == [4.0, 4.0]


@pytest.mark.parametrize("fn", ["exits", "interrupts"])
def test_a_reward_that_exits_or_interrupts_is_a_counted_failure_not_the_end_of_the_run(workdir, capsys, fn):
    # before: sys.exit(3) ended the run with exit code 3 and no message, KeyboardInterrupt killed it
    assert train(f"reward.functions=[faultrew:{fn}]", "reward.max_failure_fraction=1.0", "--out", "run") == 0
    rows = [json.loads(l) for l in (workdir / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r[f"rewards/{fn}/failures"] for r in rows] == [4.0, 4.0, 4.0]
    assert "Traceback" not in capsys.readouterr().err


# ------------------------------------------------------------------ run folders


def test_a_new_run_in_an_occupied_folder_is_refused_unless_overwrite(workdir, capsys):
    assert train("--out", "run") == 0
    before = sorted(p.name for p in (workdir / "run" / "checkpoints").iterdir())
    assert train("train.seed=7", "--out", "run") == 2
    assert "train.out='run' already holds a run" in last_error(capsys)
    assert sorted(p.name for p in (workdir / "run" / "checkpoints").iterdir()) == before  # retention deleted nothing
    assert train("train.steps=1", "--out", "run", "--overwrite") == 0
    assert sorted(p.name for p in (workdir / "run" / "checkpoints").iterdir()) == ["step-000001"]
    assert steps_in(workdir / "run") == [1]


def test_a_new_run_with_move_earlier_run_keeps_the_folders_run_whole_beside_it(workdir, capsys):
    assert train("--out", "run") == 0  # steps 1-3, keeping step-2 and step-3 (keep_checkpoints 2)
    capsys.readouterr()
    assert train("train.steps=1", "--out", "run", "train.move_earlier_run=true") == 0
    run = workdir / "run"
    (earlier,) = (run / "earlier-runs").iterdir()
    assert (
        f"grpokit: run held an earlier run (config.yaml, summary.json, metrics.jsonl, checkpoints/); it was "
        f"moved whole to {earlier.relative_to(workdir)} (nothing deleted)" in capsys.readouterr().out
    )
    assert sorted(p.name for p in (earlier / "checkpoints").iterdir()) == ["step-000002", "step-000003"]
    assert steps_in(earlier) == [1, 2, 3] and (earlier / "config.yaml").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001"]
    assert steps_in(run) == [1]


def test_resume_from_a_named_earlier_checkpoint_continues_from_it_exactly(workdir, capsys):
    """Steps 1-3 kept; ``--resume run/checkpoints/step-000001`` trains steps 2 and 3 again from step 1's state,
    which reproduces them bit for bit (the checkpoint holds the RNG); the first run's step-2 and step-3 and
    its records move to earlier-runs/ (nothing lost), the run's records hold one history: 1, 2, 3."""
    assert train("--out", "run", "train.keep_checkpoints=3") == 0
    run = workdir / "run"
    first = {n: _weights(run / "checkpoints" / n) for n in ("step-000002", "step-000003")}
    capsys.readouterr()
    assert main(["train", "--resume", "run/checkpoints/step-000001"]) == 0
    (earlier,) = (run / "earlier-runs").iterdir()
    out = capsys.readouterr().out
    assert (
        "grpokit: resuming from step-000001, earlier than the run's newest checkpoint; the later ones "
        f"(step-000002, step-000003) and a copy of the run's records as they were are moved to {earlier}" in out
    )
    assert sorted(p.name for p in (earlier / "checkpoints").iterdir()) == ["step-000002", "step-000003"]
    assert steps_in(earlier) == [1, 2, 3]  # the copy as it was
    assert steps_in(run) == [1, 2, 3]  # step 1 kept, 2 and 3 trained again
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001", "step-000002", "step-000003"]
    for n, weights in first.items():
        again = _weights(run / "checkpoints" / n)
        assert all(torch.equal(again[k], v) for k, v in weights.items())


def _weights(ckpt):
    from safetensors.torch import load_file

    return load_file(str(ckpt / "model" / "model.safetensors"))


def test_a_damaged_named_checkpoint_is_refused_not_replaced_by_another(workdir, capsys):
    assert train("--out", "run", "train.keep_checkpoints=3") == 0
    run = workdir / "run"
    opt = run / "checkpoints" / "step-000001" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:-10])
    assert main(["train", "--resume", "run/checkpoints/step-000001"]) == 2
    err = last_error(capsys)
    assert (
        err.startswith("grpokit: error: the checkpoint to resume from, ")
        and "step-000001', is damaged (optimizer.pt" in err
    )
    assert not (run / "earlier-runs").exists() and steps_in(run) == [1, 2, 3]  # nothing moved, nothing trained


def test_every_checkpoint_has_a_manifest_that_catches_a_truncated_file(workdir):
    assert train("--out", "run") == 0
    ckpt = workdir / "run" / "checkpoints" / "step-000003"
    files = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert {"model/model.safetensors", "optimizer.pt", "rng.pt", "trainer_state.json"} <= set(files)
    assert checkpoint.verify(ckpt) is None
    f = ckpt / "model" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    assert (
        checkpoint.verify(ckpt)
        == f"model/model.safetensors has 100 bytes, the manifest says {files['model/model.safetensors']['size']}"
    )


def test_resume_falls_back_past_a_truncated_latest_checkpoint(workdir, capsys):
    assert train("train.steps=2", "--out", "run") == 0  # keeps step-1 and step-2
    run = workdir / "run"
    opt = run / "checkpoints" / "step-000002" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:-10])
    capsys.readouterr()
    assert main(["train", "--resume", "run", "train.steps=3"]) == 0
    out = capsys.readouterr().out
    assert "grpokit: warning: skipping checkpoint run/checkpoints/step-000002 because optimizer.pt has" in out
    assert steps_in(run) == [1, 2, 3]  # steps 2 and 3 trained again from step 1's checkpoint
    assert checkpoint.verify(run / "checkpoints" / "step-000002") is None  # rewritten whole


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("", "is empty, so it is torn or was emptied"),
        ("half", "does not match the sha256 on its first line, so it is torn or damaged"),
    ],
)
def test_a_torn_config_yaml_is_refused_at_resume(workdir, capsys, damage, expected):
    assert train("train.steps=1", "--out", "run") == 0
    cfg = workdir / "run" / "config.yaml"
    text = cfg.read_text()
    cfg.write_text(text[: len(text) // 2].rsplit("\n", 1)[0] + "\n" if damage else "")
    assert main(["train", "--resume", "run"]) == 2
    err = last_error(capsys)
    assert err.startswith("grpokit: error: 'run/config.yaml' ") and expected in err
    assert steps_in(workdir / "run") == [1]  # nothing trained with another config


def test_changes_at_resume_go_to_the_config_history_not_into_config_yaml(workdir):
    assert train("train.steps=2", "--out", "run") == 0
    run = workdir / "run"
    original = (run / "config.yaml").read_text()
    assert (
        main(["train", "--resume", "run", "--out", "elsewhere", "train.steps=3", "optim.lr=0.002"]) == 0
    )  # saved lr: 1e-06 (the default)
    assert (run / "config.yaml").read_text() == original
    history = yaml.safe_load((run / "config_history.yaml").read_text())
    assert history == [
        {
            "step": 2,
            "changed": {
                "train.steps": {"from": 2, "to": 3},
                "optim.lr": {"from": 1e-06, "to": 0.002},
                "train.out": {"from": "run", "to": "elsewhere"},
            },
        }
    ]
    assert not (workdir / "elsewhere").exists()  # the run stays in its folder
    # the next resume starts from config.yaml + history: steps=3 holds without repeating it, and nothing is added
    assert main(["train", "--resume", "run"]) == 0
    assert len(yaml.safe_load((run / "config_history.yaml").read_text())) == 1
    assert steps_in(run) == [1, 2, 3]


def test_interrupted_saves_are_cleaned_at_the_next_start(workdir):
    assert train("train.steps=1", "--out", "run") == 0
    tmp = workdir / "run" / "checkpoints" / ".tmp-step-000002-4242"  # what SIGKILL during a save leaves
    (tmp / "model").mkdir(parents=True)
    (tmp / "optimizer.pt").write_bytes(b"half")
    assert main(["train", "--resume", "run", "train.steps=2"]) == 0
    assert not tmp.exists()
    assert sorted(p.name for p in (workdir / "run" / "checkpoints").iterdir()) == ["step-000001", "step-000002"]


def _fail_on(monkeypatch, name: str, step: int, exc: BaseException):
    """torch.save raises ``exc`` when writing ``name`` into the temporary folder of ``step``'s checkpoint."""
    real = torch.save

    def save(obj, f, *a, **kw):
        if str(f).endswith(f"step-{step:06d}-{__import__('os').getpid()}/{name}"):
            raise_as_grpokit(exc)
        return real(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", save)


def test_a_save_killed_between_files_leaves_the_previous_checkpoint_to_resume_from(workdir, monkeypatch, capsys):
    _fail_on(monkeypatch, "rng.pt", 2, RuntimeError("killed between optimizer.pt and rng.pt"))
    assert train("--out", "run") == 1
    assert last_error(capsys) == (
        "grpokit: error: an internal fault stopped the run (RuntimeError: killed between optimizer.pt "
        "and rng.pt; --debug shows the traceback); checkpoint run/checkpoints/step-000001 kept; "
        "continue with: grpokit train --resume run"
    )
    ckpts = workdir / "run" / "checkpoints"
    assert [p.name for p in ckpts.iterdir()] == ["step-000001"]  # no half checkpoint, no .tmp folder
    assert checkpoint.verify(ckpts / "step-000001") is None
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    assert main(["train", "--resume", "run"]) == 0
    assert steps_in(workdir / "run") == [1, 2, 3]


@pytest.mark.parametrize(
    "fault, code, sentence",
    [
        (
            RuntimeError("the rollout server went away"),
            1,
            "an internal fault stopped the run "
            "(RuntimeError: the rollout server went away; --debug shows the traceback)",
        ),
        (
            RewardError("Reward 'judge' failed on 4 of 4 completions, more than max_failure_fraction=0.5."),
            2,
            "Reward 'judge' failed on 4 of 4 completions, more than max_failure_fraction=0.5",
        ),
    ],
)
def test_a_fault_before_the_update_saves_the_last_finished_step_and_resumes_exactly(
    workdir, monkeypatch, capsys, fault, code, sentence
):
    # save_every=10 of 4 steps: a fault in step 3's rollout or rewards still leaves a checkpoint (not
    # "the run must start again"): steps 1-2 are saved as they ended, and resuming from there is
    # the uninterrupted run, bit for bit (the step's random draws and data position are put back)
    from grpokit.train.loop import Trainer

    args = ["train.steps=4", "train.save_every=10", "train.deterministic=true"]
    if code == 1:
        assert train(*args, "--out", "ref") == 0
    real = Trainer._scored_batch

    def scored_batch(self):
        batch = real(self)  # the step's sampling happened: its random draws must not leak into the save
        if self.step == 2:
            raise_as_grpokit(fault)
        return batch

    monkeypatch.setattr(Trainer, "_scored_batch", scored_batch)
    assert train(*args, "--out", "run") == code
    assert last_error(capsys) == (
        f"grpokit: error: {sentence}; checkpoint run/checkpoints/step-000002 kept; "
        "continue with: grpokit train --resume run"
    )
    assert checkpoint.verify(workdir / "run" / "checkpoints" / "step-000002") is None
    if code == 2:  # the resume below is the same for both faults
        return
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    assert main(["train", "--resume", "run"]) == 0
    assert steps_in(workdir / "run") == [1, 2, 3, 4]
    ref, run = (
        torch.load(workdir / r / "checkpoints" / "step-000004" / "rng.pt", weights_only=False) for r in ("ref", "run")
    )
    assert torch.equal(ref["sampler"], run["sampler"])
    from safetensors.torch import load_file

    a, b = (
        load_file(workdir / r / "checkpoints" / "step-000004" / "model" / "model.safetensors") for r in ("ref", "run")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [json.loads(l)["loss"] for l in (workdir / "ref" / "metrics.jsonl").read_text().splitlines()] == [
        json.loads(l)["loss"] for l in (workdir / "run" / "metrics.jsonl").read_text().splitlines()
    ]


def test_disk_full_while_saving_stops_with_a_sentence_and_resumes_once_free(workdir, monkeypatch, capsys):
    _fail_on(monkeypatch, "optimizer.pt", 2, OSError(errno.ENOSPC, "No space left on device", "optimizer.pt"))
    assert train("--out", "run") == 1
    err = last_error(capsys)
    assert err.startswith(
        "grpokit: error: the run stopped because writing optimizer.pt failed (No space left on device); "
        "checkpoint run/checkpoints/step-000001 kept; continue with: grpokit train --resume run"
    )
    assert checkpoint.verify(workdir / "run" / "checkpoints" / "step-000001") is None
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    assert main(["train", "--resume", "run"]) == 0
    assert steps_in(workdir / "run") == [1, 2, 3]


def test_disk_full_during_resume_truncation_keeps_the_metrics_and_resumes_once_free(workdir, monkeypatch, capsys):
    assert train("train.steps=2", "--out", "run") == 0
    run = workdir / "run"
    (run / "checkpoints" / "step-000002" / "manifest.json").write_text("{")  # damaged: resume goes back to step 1
    metrics = (run / "metrics.jsonl").read_text()

    real_open = jsonl.Path.open

    class FullDisk:  # a file that takes the first line, then the disk is full
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def writelines(self, lines):
            self.f.write(lines[0])
            raise OSError(errno.ENOSPC, "No space left on device", self.f.name)

    def open_(path, mode="r", *a, **kw):
        f = real_open(path, mode, *a, **kw)
        return FullDisk(f) if str(path).endswith(".jsonl.tmp") else f

    monkeypatch.setattr(jsonl.Path, "open", open_)
    assert main(["train", "--resume", "run"]) == 1
    assert "failed (No space left on device); checkpoint run/checkpoints/step-000001 kept" in last_error(capsys)
    assert (run / "metrics.jsonl").read_text() == metrics and not (run / "metrics.jsonl.tmp").exists()
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    assert main(["train", "--resume", "run", "train.steps=3"]) == 0
    assert steps_in(run) == [1, 2, 3]


def test_disk_full_while_writing_metrics_stops_the_run(workdir, monkeypatch, capsys):
    real = jsonl.JsonlSink.log

    def log(self, metrics, step):
        if step == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.run_dir / "metrics.jsonl"))
        real(self, metrics, step)

    monkeypatch.setattr(jsonl.JsonlSink, "log", log)
    assert train("--out", "run") == 1
    assert "(No space left on device); checkpoint run/checkpoints/step-000001 kept" in last_error(capsys)
    assert steps_in(workdir / "run") == [1]
