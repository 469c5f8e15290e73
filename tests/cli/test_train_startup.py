"""`grpokit train --config` tells a grpokit config from a TRL-style one without importing the TRL layer
(transformers' Trainer and peft: seconds at every start of every run, and of every test that starts one);
a TRL-style file, or one it cannot read, still goes to the TRL layer's reader, which decides."""

import subprocess
import sys

import pytest

from grpokit.cli.train_command import has_grpokit_sections
from grpokit.config import ConfigError


def test_a_grpokit_config_is_told_apart_without_the_trl_layer(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("train: {steps: 2}\nrollout: {group_size: 4}\n")
    probe = (
        "import sys; from grpokit.cli.train_command import has_grpokit_sections; "
        f"assert has_grpokit_sections({str(cfg)!r}); "
        "assert not [m for m in sys.modules if m.startswith(('grpokit.trl', 'peft', 'transformers.trainer'))], "
        "sorted(m for m in sys.modules if m.startswith(('grpokit.trl', 'peft', 'transformers.trainer')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(
    "text",
    [
        "learning_rate: 1.0e-5\nmodel_name_or_path: x\n",  # TRL's flat names
        "just a string\n",  # not a mapping
        "train: [unclosed\n",  # not YAML: the reader that follows says so
        "",
    ],
)
def test_anything_else_goes_to_the_trl_layers_reader(tmp_path, text):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(text)
    assert not has_grpokit_sections(str(cfg))
    assert not has_grpokit_sections(str(tmp_path / "missing.yaml"))


def test_a_key_given_twice_is_the_same_sentence_as_before(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("train: {steps: 2}\ntrain: {steps: 3}\n")
    with pytest.raises(ConfigError, match=rf"^config file {str(cfg)!r}.*'train'"):
        has_grpokit_sections(str(cfg))
