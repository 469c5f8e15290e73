"""Honest classes (issue 48): the model, the data, the user's code, the disk and grpokit each have
their own words, and "an internal fault" is kept for grpokit's own bugs. Real runs of the demo model
through `grpokit train`, in process."""

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from grpokit.train.faults import classify
from helpers import faults_runs
from helpers.faults_runs import last_error, raise_as_grpokit, steps_in, train

workdir = faults_runs.workdir  # the fixture


def _demo_model() -> Path:
    import grpokit.data.tasks as tasks

    return Path(tasks.__file__).parent / "assets" / "demo-model"


def test_a_model_whose_weights_are_nan_is_the_models_fault_not_an_internal_one(workdir, capsys):
    model = workdir / "nan-model"
    shutil.copytree(_demo_model(), model)
    weights = load_file(model / "model.safetensors")
    save_file({k: torch.full_like(v, float("nan")) for k, v in weights.items()}, model / "model.safetensors")
    assert train(f"model.name_or_path={model}", "--out", "run") == 2
    err = last_error(capsys)
    assert "internal fault" not in err, err
    assert err.startswith("grpokit: error: the model's next-token log-probabilities are NaN (completion 0, token 0)")
    assert "resume from an earlier checkpoint with a lower optim.lr" in err


def test_an_exception_in_the_users_plugin_names_their_file_and_line(workdir, capsys):
    (workdir / "userplug.py").write_text("def adv(ctx):\n    raise ValueError('my advantage broke')\n")
    assert train("algo.advantage=userplug:adv", "--out", "run") == 2
    err = last_error(capsys)
    assert err.startswith(
        f"grpokit: error: your code raised ValueError: my advantage broke ({workdir / 'userplug.py'}, line 2, in adv); "
        "fix it and run again (--debug shows the traceback)"
    ), err


def test_a_bug_of_grpokit_stays_internal_and_a_library_error_under_it_too():
    try:
        raise_as_grpokit(RuntimeError("a bug"))
    except RuntimeError as e:
        assert classify(e) is None
    try:
        torch.zeros(2) @ torch.zeros(3)  # raised inside torch, called from this file: the caller's code
    except RuntimeError as e:
        assert classify(e).sentence.startswith("your code raised RuntimeError: ")


def test_a_data_file_with_a_byte_order_mark_is_read(workdir, capsys):
    for name, text in (
        ("bom.jsonl", (workdir / "train.jsonl").read_text()),
        ("bom.csv", "question,solution\n" + "".join(f"{a}+{a}=,{2 * a}\n" for a in range(10, 16))),
    ):
        (workdir / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert train("train.steps=1", f"--out=run-{name}", data=name) == 0, capsys.readouterr().err
        assert steps_in(workdir / f"run-{name}") == [1]


def test_an_empty_prompt_names_its_file_and_row(workdir, capsys):
    lines = (workdir / "train.jsonl").read_text().splitlines(keepends=True)
    lines[2] = '{"question": "  ", "solution": "4"}\n'
    (workdir / "gap.jsonl").write_text("".join(lines))
    assert train("--out", "run", data="gap.jsonl") == 2
    assert last_error(capsys) == (
        "grpokit: error: row 3 of 'gap.jsonl' has an empty prompt (column 'question'); give every row a prompt"
    )
