"""The README's Python example runs as written, and every `grpokit` command in it runs as printed
(in order, in one working directory, with fewer steps appended), except those that need a GPU or a
download: the own-model example is checked as the config it builds."""

import re
import shlex

from helpers.paths import ROOT

README = ROOT / "README.md"


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
    from grpokit.cli.app import COMMANDS

    shell = "\n".join(re.findall(r"```bash\n(.*?)```", README.read_text(), re.S))
    commands = re.findall(r"^grpokit ([\w-]+)", shell, re.M)
    assert {"train", "eval", "report", "presets"} <= set(commands)
    for cmd in commands:
        assert cmd in COMMANDS or cmd == "--version", cmd


REDUCED = {"train": ["train.steps=2", "data.eval_size=8"], "eval": ["--limit", "8"]}
"""Appended to the commands so that they run in seconds (later overrides win)."""


def readme_commands() -> list[list[str]]:
    shell = "\n".join(re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)).replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in shell.splitlines() if line.startswith("grpokit ")]


def test_every_readme_command_runs_as_printed(tmp_path, monkeypatch, capsys):
    from grpokit.cli import main
    from grpokit.cli.train_command import build_config, train_parser
    from grpokit.train import run_data

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.yaml").write_text(re.search(r"```yaml\n(.*?)```", README.read_text(), re.S).group(1))
    (tmp_path / "train.jsonl").write_text('{"question": "What is 2+3?", "solution": "5"}\n')
    ran, checked = [], []
    for argv in readme_commands():
        cmd = argv[1]
        if cmd == "vllm-serve":  # a GPU and vLLM
            continue
        if cmd == "trl":  # TRL's command line with placeholder model and dataset names: parsed as TRL would
            from grpokit.trl.script import parse

            (script_args, _, model_args, _), extra = parse(argv[3:])
            assert (model_args.model_name_or_path, script_args.dataset_name, extra) == ("M", "D", [])
            assert script_args.reward_funcs == ["accuracy_reward"]
            checked.append(argv)
            continue
        if any(a.startswith("model.name_or_path=") and "/" in a for a in argv):  # a hub model: a download
            cfg = run_data.resolve_run(build_config(train_parser().parse_args(argv[2:])))
            assert (cfg.rollout.max_new_tokens, cfg.optim.lr, cfg.data.task) == (512, 1e-6, "")
            checked.append(argv)
            continue
        try:
            rc = main(argv[1:] + ([] if "--help" in argv else REDUCED.get(cmd, [])))
        except SystemExit as e:  # --help
            rc = e.code
        assert rc == 0, (argv, capsys.readouterr().err[-2000:])
        ran.append(cmd)
    assert ran.count("train") == 7 and {"eval", "report", "presets", "--version"} <= set(ran) and len(checked) == 2
    assert (tmp_path / "runs" / "exp1" / "report.html").exists()
    assert sorted(p.name for p in (tmp_path / "runs" / "exp1" / "checkpoints").iterdir()) == ["step-000002"]
