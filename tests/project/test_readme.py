"""The README and the pages it sends a newcomer to run as written. The README starts with the two commands,
reads in two minutes and maps every page of docs/ once; its quick tour's commands are lines of
docs/COMMANDS.md, and every `grpokit` command there runs as printed (in order, in one working directory,
with fewer steps appended), except those that need a GPU or a download: the own-model example and the
real-model preset are checked as the configs they build. docs/GUIDE.md's Python example runs."""

import re
import shlex

from helpers.paths import ROOT

README = ROOT / "README.md"
COMMANDS = ROOT / "docs" / "COMMANDS.md"
GUIDE = ROOT / "docs" / "GUIDE.md"


def blocks(path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), re.S)


def commands(path) -> list[list[str]]:
    shell = "\n".join(blocks(path, "bash")).replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in shell.splitlines() if line.startswith("grpokit ")]


def test_readme_starts_with_the_two_commands():
    first_block = blocks(README, "bash")[0].splitlines()
    assert first_block[0].startswith("make train") and first_block[1].startswith("make test")
    assert "make test" in (README.parent / ".ci" / "run").read_text()


def test_readme_reads_in_two_minutes_and_maps_every_doc_once():
    text = README.read_text()
    before_map = text.split("## Documentation")[0]
    # the two commands, the paragraph and the quick tour fit a first screen or two (~350 words)
    assert len(before_map.splitlines()) <= 40 and len(before_map.split()) <= 400, len(before_map.split())
    doc_map = text.split("## Documentation")[1].split("\n## ")[0]
    listed = re.findall(r"\[docs/(\w+\.md)\]", doc_map)
    assert len(listed) == len(set(listed)), f"a page listed twice: {listed}"
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(listed) == pages, "the documentation map lists each page of docs/ once, and only those"


def test_the_quick_tour_is_lines_of_the_command_reference():
    tour, reference = commands(README), commands(COMMANDS)
    assert len(tour) >= 6
    missing = [" ".join(c) for c in tour if c not in reference]
    assert not missing, f"README commands that docs/COMMANDS.md does not run: {missing}"


def test_guide_python_example_runs(tmp_path, monkeypatch, capsys):
    code_blocks = blocks(GUIDE, "python")
    assert code_blocks, "docs/GUIDE.md has no Python example"
    monkeypatch.chdir(tmp_path)  # runs/ goes here
    for code in code_blocks:
        exec(compile(code, "GUIDE.md", "exec"), {})
    out = capsys.readouterr().out
    assert re.search(r"\d\.\d+ -> \d\.\d+", out)
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "summary.json").exists()


def test_reference_commands_are_real():
    from grpokit.cli.app import COMMANDS as CLI

    names = [argv[1] for argv in commands(COMMANDS)]
    assert {"train", "eval", "report", "doctor", "presets", "trl"} <= set(names)
    for cmd in names:
        assert cmd in CLI or cmd == "--version", cmd


REDUCED = {"train": ["train.steps=2", "data.eval_size=8"], "eval": ["--limit", "8"]}
"""Appended to the commands so that they run in seconds (later overrides win)."""


def test_every_reference_command_runs_as_printed(tmp_path, monkeypatch, capsys):
    from grpokit.cli import main
    from grpokit.cli.train_command import build_config, parse_train_args
    from grpokit.train import run_data

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.yaml").write_text(blocks(COMMANDS, "yaml")[0])
    (tmp_path / "train.jsonl").write_text('{"question": "What is 2+3?", "solution": "5"}\n')
    ran, checked = [], []
    for argv in commands(COMMANDS):
        cmd = argv[1]
        if cmd == "vllm-serve":  # a GPU and vLLM
            continue
        if cmd == "rollout-worker":  # it would wait for a trainer on another host: parsed as it would be
            from grpokit.rollout.async_remote_worker import parser

            args = parser().parse_args(argv[2:])
            assert (args.connect, args.threads, args.wait) == ("trainer:29710", 0, 600.0)
            assert (args.persist, args.device) in [(True, "cpu"), (False, "cuda:0")], argv
            checked.append(argv)
            continue
        if cmd == "trl":  # TRL's command line with placeholder model and dataset names: parsed as TRL would
            from grpokit.trl.scripts.trl_grpo import parse

            (script_args, _, model_args, _), extra = parse(argv[3:])
            assert (model_args.model_name_or_path, script_args.dataset_name, extra) == ("M", "D", [])
            assert script_args.reward_funcs == ["accuracy_reward"]
            checked.append(argv)
            continue
        if any(a.startswith("model.name_or_path=") and "/" in a for a in argv):  # a hub model: a download
            cfg = run_data.resolve_run(build_config(parse_train_args(argv[2:])))
            assert (cfg.rollout.max_new_tokens, cfg.optim.lr, cfg.data.task) == (512, 1e-6, "")
            checked.append(argv)
            continue
        if "smollm2-math" in argv:  # a 135M model converted on first use: minutes of CPU for two steps
            cfg = run_data.resolve_run(build_config(parse_train_args(argv[2:])))
            assert (cfg.model.name_or_path, cfg.data.task) == (
                "smollm2-135m-instruct",
                "reasoning_gym:basic_arithmetic",
            )
            checked.append(argv)
            continue
        try:
            rc = main(argv[1:] + ([] if "--help" in argv else REDUCED.get(cmd, [])))
        except SystemExit as e:  # --help
            rc = e.code
        assert rc == 0, (argv, capsys.readouterr().err[-2000:])
        ran.append(cmd)
    assert ran.count("train") == 7 and {"eval", "report", "doctor", "presets", "--version"} <= set(ran)
    assert len(checked) == 5
    assert (tmp_path / "runs" / "exp1" / "report.html").exists()
    assert sorted(p.name for p in (tmp_path / "runs" / "exp1" / "checkpoints").iterdir()) == ["step-000002"]
