"""The README's Python example runs as written, and its commands exist."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).splitlines()
    assert first_block[0].startswith("make train") and first_block[1].startswith("make test")
    assert "make test" in (README.parent / ".ci" / "run").read_text()


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has no Python example"
    monkeypatch.chdir(tmp_path)  # runs/ goes here
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert re.search(r"\d\.\d+ -> \d\.\d+", out)
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "summary.json").exists()


def test_readme_cli_commands_are_real():
    from grpokit.cli import COMMANDS

    shell = "\n".join(re.findall(r"```bash\n(.*?)```", README.read_text(), re.S))
    commands = re.findall(r"^grpokit ([\w-]+)", shell, re.M)
    assert {"train", "eval", "report", "presets"} <= set(commands)
    for cmd in commands:
        assert cmd in COMMANDS, cmd
