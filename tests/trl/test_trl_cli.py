"""``grpokit trl grpo`` takes ``trl grpo``'s arguments, and ``grpokit train --config`` reads the same
flat YAML: end to end on the tiny local chat model and a local dataset folder (train/test JSON lines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from grpokit.cli import main
from grpokit.config.base import ConfigError
from grpokit.trl.scripts.trl_grpo import launcher_processes


def _folder(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 8), ("test", 4)):
        rows = [{"prompt": [{"role": "user", "content": f"add {a} and 1"}], "solution": str(a + 1)} for a in range(n)]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_rewards_cli.py").write_text(
        "def short(completions, **kw):\n    return [-len(c[0]['content']) / 10 for c in completions]\n"
    )
    return data


ARGS = {
    "reward_funcs": ["think_format_reward", "my_rewards_cli.short"],
    "max_steps": 2,
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 4,
    "use_cpu": True,
    "gradient_checkpointing": False,
    "disable_tqdm": True,
    "report_to": "none",
    "learning_rate": 1e-4,
    "eval_strategy": "steps",
    "eval_steps": 2,
    "per_device_eval_batch_size": 4,
    "save_strategy": "no",
}


def _flags(args: dict) -> list[str]:
    out = []
    for key, value in args.items():
        out += [f"--{key}", *(value if isinstance(value, list) else [str(value)])]
    return out


def _trl_grpo(argv: list[str], cwd) -> subprocess.CompletedProcess:
    """``grpokit trl grpo ARGV`` in a process of its own, run from ``cwd``."""
    env = {**os.environ, "TMPDIR": str(cwd)}  # torchrun's log folders (torchelastic_*) stay out of /tmp
    return subprocess.run(
        [sys.executable, "-m", "grpokit", "trl", "grpo", *argv],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        env=env,
    )


def test_trl_grpo_command_line_and_the_same_yaml_make_the_same_run(chat_model, tmp_path, monkeypatch):
    data = _folder(tmp_path)
    monkeypatch.chdir(tmp_path)  # the dotted reward path is found from the working directory, as with trl grpo
    cli = tmp_path / "cli-run"
    argv = [
        "--model_name_or_path",
        str(chat_model),
        "--dataset_name",
        str(data),
        "--output_dir",
        str(cli),
        *_flags(ARGS),
    ]
    done = _trl_grpo(argv, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"model saved to {cli}" in done.stdout

    recipe = tmp_path / "grpo.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": str(chat_model), "dataset_name": str(data), **ARGS}))
    from_yaml = tmp_path / "yaml-run"
    assert main(["train", "--config", str(recipe), "--out", str(from_yaml)]) == 0

    a, b = (yaml.safe_load((run / "config.yaml").read_text()) for run in (cli, from_yaml))
    a["train"].pop("out"), b["train"].pop("out")
    assert a == b  # one resolved grpokit config from the flags and from the file
    assert a["optim"]["lr"] == 1e-4 and a["train"]["steps"] == 2 and a["train"]["save_every"] == 0
    for run in (cli, from_yaml):
        assert (run / "model.safetensors").exists()  # save_model(output_dir), as TRL's script
        steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps if "reward" in s] == [1, 2]
        assert any("eval/reward" in s or "eval_reward" in s for s in steps) or (run / "summary.json").exists()


def test_trl_grpo_mistakes_are_one_sentence(chat_model, tmp_path, capsys):
    data = _folder(tmp_path)
    base = [
        "trl",
        "grpo",
        "--model_name_or_path",
        str(chat_model),
        "--dataset_name",
        str(data),
        "--output_dir",
        str(tmp_path / "run"),
        "--max_steps",
        "1",
    ]
    for extra, words in [
        (["--reward_funcs", "no_such_reward"], "reward_funcs entry 'no_such_reward' is not one of"),
        (["--learnin_rate", "1e-5"], "'--learnin_rate' is not an argument of trl grpo's script"),
        (["--dataset_train_split", "nope"], "the dataset has no 'nope' split (it has train, test)"),
        (["--num_generations", "1"], "GRPOConfig argument num_generations=1 is not valid"),
    ]:
        assert main(base + extra) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]  # above it: datasets' progress bars only
        assert last.startswith("grpokit: error: ") and words in last, last


def test_launcher_arguments_are_trls_num_processes_only():
    assert launcher_processes([]) == 1
    assert launcher_processes(["--num_processes", "4"]) == 4 and launcher_processes(["--num_processes=2"]) == 2
    with pytest.raises(ConfigError, match="num_processes='x' is not valid"):
        launcher_processes(["--num_processes", "x"])
    with pytest.raises(ConfigError, match="'--mixed_precision' is not an argument"):
        launcher_processes(["--mixed_precision", "bf16"])


def test_trl_grpo_num_processes_2_runs_two_ranks_under_torchrun(chat_model, tmp_path):
    # TRL's `trl grpo --num_processes 2` (accelerate launch): grpokit re-runs the command under torchrun,
    # two CPU processes on gloo; each takes per_device_train_batch_size 4 completions, so a step is
    # 2 x 4 / num_generations 4 = 2 prompts (1 with one process)
    data = _folder(tmp_path)
    run = tmp_path / "two-ranks"
    args = {k: v for k, v in ARGS.items() if not k.startswith(("eval", "per_device_eval"))}
    args["reward_funcs"] = ["think_format_reward"]
    argv = ["--num_processes", "2", "--model_name_or_path", chat_model, "--dataset_name", str(data)]
    done = _trl_grpo([*argv, "--output_dir", str(run), *_flags(args)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"model saved to {run}" in done.stdout
    # the GRPOConfig joined the gloo group (transformers' TrainingArguments): no grpokit setting is warned unread
    # (before: "train.dist_timeout_s=1800 changes nothing in this run", ddp_timeout never set)
    assert "dist_timeout_s" not in done.stderr + done.stdout
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["prompts_per_step"] == 2
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "reward" in s] == [1, 2]
