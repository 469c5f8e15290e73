"""A user's files, refused in one sentence with exit status 2: `grpokit report` and `grpokit doctor` on a
folder that holds no run, and a YAML key given twice (YAML keeps the last silently) wherever grpokit
reads YAML a user wrote or may edit: --config (grpokit or TRL style), overrides, a run's config.yaml and
config_history.yaml at --resume, preset files."""

import pytest

from grpokit.cli import main
from grpokit.config import presets
from grpokit.config.io import load_yaml, strict_yaml
from grpokit.config.sections import ConfigError


def last_error(capsys) -> str:
    err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("grpokit")]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("command", ["report", "doctor"])
@pytest.mark.parametrize("case", ["missing", "empty", "other files", "a file"])
def test_report_and_doctor_refuse_a_folder_without_a_run(tmp_path, capsys, command, case):
    target = tmp_path / "x"
    if case == "empty":
        target.mkdir()
    elif case == "other files":
        target.mkdir()
        (target / "notes.txt").write_text("hello")
    elif case == "a file":
        target.write_text("metrics")
    assert main([command, str(target)]) == 2
    err = last_error(capsys)
    expected = {
        "missing": "does not exist",
        "empty": "holds no run (no config.yaml, metrics.jsonl or summary.json)",
        "other files": "holds no run (no config.yaml, metrics.jsonl or summary.json)",
        "a file": "is a file, not a run folder",
    }[case]
    assert err.startswith("grpokit: error: ") and expected in err
    assert not (tmp_path / "x" / "report.html").exists()


def test_doctor_refuses_a_run_without_a_logged_step(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("train: {steps: 2}\n")
    assert main(["doctor", str(tmp_path / "run")]) == 2
    assert "has no metrics.jsonl yet (no step has finished)" in last_error(capsys)
    (tmp_path / "run" / "metrics.jsonl").write_text("")  # created, nothing logged: not "nothing to fix"
    assert main(["doctor", str(tmp_path / "run")]) == 2
    assert "has no step in metrics.jsonl yet" in last_error(capsys)


def test_a_section_given_twice_is_refused_with_its_lines(tmp_path, capsys):
    f = tmp_path / "cfg.yaml"
    f.write_text("train:\n  steps: 3\nrollout:\n  group_size: 2\ntrain:\n  steps: 40\n")
    assert main(["train", "--config", str(f), "--out", str(tmp_path / "run")]) == 2
    assert last_error(capsys) == (
        f"grpokit: error: config file {str(f)!r} gives the key 'train' twice (line 1 and line 5); "
        "YAML would keep only the last one silently, so remove or merge one of them"
    )
    assert not (tmp_path / "run").exists()


def test_a_field_given_twice_inside_a_section_is_named_with_its_section(tmp_path):
    f = tmp_path / "cfg.yaml"
    f.write_text("optim:\n  lr: 0.1\n  warmup_steps: 2\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match=r"gives the key 'optim.lr' twice \(line 2 and line 4\)"):
        load_yaml(f)
    f.write_text("optim: {lr: 0.1, lr: 0.2}\n")  # flow style
    with pytest.raises(ConfigError, match=r"'optim.lr' twice \(both on line 1\)"):
        load_yaml(f)


def test_a_trl_style_file_and_overrides_with_a_key_twice_are_refused(tmp_path, capsys):
    f = tmp_path / "trl.yaml"
    f.write_text("learning_rate: 1.0e-5\nmax_steps: 2\nlearning_rate: 2.0e-5\n")
    assert main(["train", "--config", str(f)]) == 2
    assert "gives the key 'learning_rate' twice (line 1 and line 3)" in last_error(capsys)
    assert (
        main(
            [
                "train",
                "--out",
                str(tmp_path / "r"),
                "reward.params={repetition_penalty: {ngram_size: 2, ngram_size: 3}}",
            ]
        )
        == 2
    )
    assert "gives the key 'repetition_penalty.ngram_size' twice" in last_error(capsys)


def test_a_runs_config_and_history_with_a_key_twice_are_refused_at_resume(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000001").mkdir(parents=True)
    (run / "config.yaml").write_text("train:\n  steps: 3\n  steps: 4\n")
    assert main(["train", "--resume", str(run)]) == 2
    assert (
        f"the run's {str(run / 'config.yaml')!r} gives the key 'train.steps' twice (line 2 and line 3)"
        in last_error(capsys)
    )


def test_history_with_a_key_twice_is_refused(tmp_path):
    from grpokit.config.sections import Config
    from grpokit.train.resume import load_run_config, write_config

    write_config(tmp_path, Config(), None)
    (tmp_path / "config_history.yaml").write_text(
        "- step: 2\n  changed:\n    train.steps: {from: 3, to: 5}\n    train.steps: {from: 3, to: 9}\n"
    )
    with pytest.raises(
        ConfigError, match=r"config_history.yaml' gives the key 'changed.train.steps' twice \(line 3 and line 4\)"
    ):
        load_run_config(tmp_path)


def test_a_history_entry_without_its_new_value_is_refused_not_set_to_none(tmp_path):
    # an unsealed history (no checksum line: an old file, or one whose line was removed) cut in an entry
    from grpokit.config.sections import Config
    from grpokit.train.resume import load_run_config, write_config

    write_config(tmp_path, Config(), None)
    (tmp_path / "config_history.yaml").write_text("- step: 2\n  changed:\n    train.steps:\n      from: 3\n")
    with pytest.raises(ConfigError, match=r"changes train.steps at step 2 without its new value \('to:'\)"):
        load_run_config(tmp_path)
    (tmp_path / "config_history.yaml").write_text("- step: 2\n  changed:\n    train.steps: {from: 3, to: zero}\n")
    with pytest.raises(ConfigError, match=r"config_history.yaml', the change of train.steps at step 2: "):
        load_run_config(tmp_path)


def test_a_preset_file_with_a_key_twice_is_refused(tmp_path, monkeypatch):
    (tmp_path / "twice.yaml").write_text("# a preset\nalgo:\n  beta: 0.0\n  beta: 0.04\n")
    monkeypatch.setattr(presets, "HERE", tmp_path)
    with pytest.raises(
        ConfigError, match=r"preset file .*twice.yaml' gives the key 'algo.beta' twice \(line 3 and line 4\)"
    ):
        presets.load("twice")


def test_the_shipped_presets_have_no_key_twice():
    for name in presets.names():
        presets.load(name)


def test_yaml_that_repeats_nothing_is_accepted_anchors_and_merge_keys_included():
    text = (
        "base: &b {lr: 0.1, warmup_steps: 2}\noptim:\n  <<: *b\n  lr: 0.2\n"
        "reward: {params: {f: {a: 1}, g: {a: 2}}}\nlist: [{a: 1}, {a: 2}]\nkeys: {1: x, '1': y}\n"
    )
    data = strict_yaml(text, "test")
    assert data["optim"] == {"lr": 0.2, "warmup_steps": 2} and data["keys"] == {1: "x", "1": "y"}
    assert strict_yaml("a: &x [*x]\n", "test")["a"][0] is not None  # a recursive alias does not loop
