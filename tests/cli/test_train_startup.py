"""`grpokit train --config` tells a grpokit config from a TRL-style one without importing the TRL layer
(transformers' Trainer and peft: seconds at every start of every run, and of every test that starts one);
config/style.py decides (tests/config/test_config_style.py); a file it cannot read goes to grpokit's reader."""

import subprocess
import sys

import pytest

from grpokit.cli.train_command import trl_style_config
from grpokit.config import ConfigError


def test_a_grpokit_config_is_told_apart_without_the_trl_layer(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("train: {steps: 2}\nrollout: {group_size: 4}\nenv: {name: x}\noptim: {lr: 0.1}\n")
    probe = (
        "import sys; from grpokit.cli.train_command import trl_style_config; "
        f"assert trl_style_config({str(cfg)!r}) is None; "
        "assert not [m for m in sys.modules if m.startswith(('grpokit.trl', 'peft', 'transformers.trainer'))], "
        "sorted(m for m in sys.modules if m.startswith(('grpokit.trl', 'peft', 'transformers.trainer')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(
    "text",
    [
        "just a string\n",  # not a mapping
        "train: [unclosed\n",  # not YAML: grpokit's reader says so
        "",
        "trian: {steps: 2}\n",  # no TRL name: grpokit's reader refuses the unknown section
    ],
)
def test_anything_not_trl_style_goes_to_grpokits_reader(tmp_path, text):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(text)
    assert trl_style_config(str(cfg)) is None
    assert trl_style_config(str(tmp_path / "missing.yaml")) is None


def test_a_trl_style_file_is_its_mapping(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("learning_rate: 1.0e-5\nmodel_name_or_path: x\noptim: adamw_torch\nenv: {A: b}\n")
    assert trl_style_config(str(cfg)) == {
        "learning_rate": 1.0e-5,
        "model_name_or_path": "x",
        "optim": "adamw_torch",
        "env": {"A": "b"},
    }


def test_a_key_given_twice_is_the_same_sentence_as_before(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("train: {steps: 2}\ntrain: {steps: 3}\n")
    with pytest.raises(ConfigError, match=rf"^config file {str(cfg)!r}.*'train'"):
        trl_style_config(str(cfg))
