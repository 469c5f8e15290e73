"""``grpokit trl grpo`` / ``grpokit train --config trl.yaml``: ModelConfig's flags and the user's
``model_init_kwargs`` reach the trainer as TRL's trl/scripts/grpo.py passes them (the user's keys over the
flags'), a flag grpokit cannot honour is refused by the name the user typed, and a TRL YAML with ``env:`` or
``optim:`` (both also grpokit section names) is read as TRL's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from grpokit.cli import main
from grpokit.cli.train_command import trl_style_config
from grpokit.config.base import ConfigError
from grpokit.trl.scripts import trl_grpo

DOCS = Path(__file__).resolve().parents[2] / "docs" / "TRL.md"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    rows = [{"prompt": [{"role": "user", "content": f"say {a}"}]} for a in range(4)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _argv(chat_model, data, tmp_path, *extra):
    return [
        "--model_name_or_path", chat_model, "--dataset_name", str(data), "--output_dir", str(tmp_path / "run"),
        "--max_steps", "1", "--use_cpu", "--report_to", "none", "--per_device_train_batch_size", "4",
        "--num_generations", "4", "--max_completion_length", "4", "--reward_funcs", "think_format_reward",
        "--save_strategy", "no", *extra,
    ]  # fmt: skip


def _build(argv):
    objects, _ = trl_grpo.parse(argv)
    return objects, trl_grpo.build_trainer(*objects)


@pytest.mark.parametrize(
    "extra, dtype, attn",
    [
        # the user's model_init_kwargs win over ModelConfig's defaults (dtype float32, attention None: auto)
        (["--model_init_kwargs", '{"dtype": "bfloat16", "attn_implementation": "eager"}'], "bfloat16", "eager"),
        # ... and over the flags themselves: the dict's dtype beats --dtype float16
        (["--dtype", "float16", "--model_init_kwargs", '{"dtype": "bfloat16"}'], "bfloat16", "auto"),
        # a key the dict does not give stays the flag's
        (["--attn_implementation", "sdpa", "--model_init_kwargs", '{"dtype": "float16"}'], "float16", "sdpa"),
        (["--dtype", "auto"], "auto", "auto"),  # the flags alone
    ],
)
def test_model_init_kwargs_reach_the_model_over_the_flags(chat_model, data, tmp_path, extra, dtype, attn):
    objects, trainer = _build(_argv(chat_model, data, tmp_path, *extra))
    assert (trainer.cfg.model.dtype, trainer.cfg.model.attn_implementation) == (dtype, attn)
    assert objects[1].model_init_kwargs["revision"] == "main"  # as TRL's: the flags' keys are all there


def test_model_init_kwargs_are_what_trls_own_script_passes(chat_model, data, tmp_path, monkeypatch):
    trl = pytest.importorskip("trl")
    from trl.scripts.grpo import main as trl_main
    from trl.scripts.grpo import make_parser as trl_parser

    argv = _argv(chat_model, data, tmp_path, "--dtype", "float16", "--model_init_kwargs", '{"dtype": "bfloat16"}')
    seen = {}

    class Stop(Exception):
        pass

    def capture(**kwargs):
        seen.update(kwargs["args"].model_init_kwargs)
        raise Stop

    monkeypatch.setattr(trl, "GRPOTrainer", capture)
    with pytest.raises(Stop):
        trl_main(*trl_parser().parse_args_and_config(argv))
    objects, _ = _build(argv)
    assert (
        objects[1].model_init_kwargs
        == seen
        == {
            "revision": "main",
            "trust_remote_code": False,
            "attn_implementation": None,
            "dtype": "bfloat16",
        }
    )


@pytest.mark.parametrize(
    "extra, sentence",
    [
        (
            ["--use_peft", "--use_rslora"],
            "--use_rslora=True is not supported by grpokit; leave it at PEFT's default False",
        ),
        (["--use_peft", "--use_dora"], "--use_dora=True is not supported by grpokit; leave it at PEFT's default False"),
        (
            ["--use_peft", "--lora_target_parameters", "mlp.experts"],
            "--lora_target_parameters=['mlp.experts'] is not supported by grpokit; leave it at PEFT's default None",
        ),
        (["--load_in_4bit"], "--load_in_4bit is not supported by grpokit: it trains the model's weights unquantized"),
        (["--load_in_8bit"], "--load_in_8bit is not supported by grpokit: it trains the model's weights unquantized"),
        (
            ["--model_revision", "v2"],
            "--model_revision 'v2' is not supported by grpokit: it loads a model's main revision only",
        ),
        (
            ["--attn_implementation", "magic"],
            "--attn_implementation 'magic' is not supported by grpokit; valid: eager, sdpa",
        ),
        # a key of the user's own model_init_kwargs is refused by that name (it wins over --model_revision)
        (
            ["--model_revision", "v3", "--model_init_kwargs", '{"revision": "v2"}'],
            "GRPOConfig argument model_init_kwargs={'revision': 'v2'} is not supported by grpokit",
        ),
    ],
)
def test_a_flag_grpokit_cannot_honour_is_refused_by_its_name(chat_model, data, tmp_path, extra, sentence):
    with pytest.raises(ConfigError) as e:
        _build(_argv(chat_model, data, tmp_path, *extra))
    assert str(e.value).startswith(sentence), str(e.value)
    assert "\n" not in str(e.value)


def _docs_example() -> dict:
    """The TRL-style YAML of docs/TRL.md (the block after "reads the same flat YAML")."""
    text = DOCS.read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text[text.index("reads the same flat YAML") :], re.S)
    return yaml.safe_load(blocks[0])


def test_the_docs_trl_yaml_with_env_is_trl_style(tmp_path):
    example = _docs_example()
    assert example["env"] == {"TOKENIZERS_PARALLELISM": "false"} and "model_name_or_path" in example
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(example))
    assert trl_style_config(str(path)) == example  # before: None, then "unknown config section 'model_name_or_path'"


def test_a_trl_yaml_with_env_and_optim_trains_under_grpokit_train(chat_model, data, tmp_path, monkeypatch):
    monkeypatch.delenv("GRPOKIT_TEST_STYLE_ENV", raising=False)
    recipe = {
        "model_name_or_path": chat_model, "dataset_name": str(data), "reward_funcs": ["think_format_reward"],
        "num_generations": 4, "per_device_train_batch_size": 4, "max_completion_length": 4, "max_steps": 1,
        "use_cpu": True, "report_to": "none", "save_strategy": "no", "optim": "adamw_torch",
        "env": {"GRPOKIT_TEST_STYLE_ENV": "yes"},
    }  # fmt: skip
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "out")]) == 0
    assert __import__("os").environ["GRPOKIT_TEST_STYLE_ENV"] == "yes"  # exported, as TRL's parser does
    monkeypatch.delenv("GRPOKIT_TEST_STYLE_ENV")


def test_a_file_of_both_styles_is_one_sentence(tmp_path, capsys):
    path = tmp_path / "mixed.yaml"
    path.write_text("model: {name_or_path: m}\nlearning_rate: 1.0e-6\n")
    assert main(["train", "--config", str(path)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        f"grpokit: error: config file {str(path)!r} mixes grpokit's sections (model) with TRL's flat argument names "
        "(learning_rate); write it in one style: grpokit's sections (model: {name: ...}, train: {steps: ...}) or "
        "only TRL's names (model_name_or_path: ..., max_steps: ...)"
    ), last


def test_a_yamls_model_init_kwargs_mapping_reaches_the_model(chat_model, data, tmp_path):
    # grpokit train --config's path: the YAML's keys become the parser's defaults (parse(config=...))
    recipe = {
        "model_name_or_path": chat_model, "dataset_name": str(data), "output_dir": str(tmp_path / "run"),
        "max_steps": 1, "use_cpu": True, "report_to": "none", "per_device_train_batch_size": 4,
        "num_generations": 4, "max_completion_length": 4, "reward_funcs": ["think_format_reward"],
        "model_init_kwargs": {"dtype": "bfloat16", "attn_implementation": "eager"},
    }  # fmt: skip
    objects, _ = trl_grpo.parse(config=recipe)
    trainer = trl_grpo.build_trainer(*objects)
    assert (trainer.cfg.model.dtype, trainer.cfg.model.attn_implementation) == ("bfloat16", "eager")


def test_a_lora_target_refused_when_the_run_is_built_names_its_flag(chat_model, data, tmp_path):
    # The adapters are made in train(), not in GRPOTrainer(...): run() builds and trains under the flags' names
    # (before: "peft_config.target_modules ..." for a flag the user typed as --lora_target_modules)
    argv = _argv(chat_model, data, tmp_path, "--use_peft", "--lora_target_modules", "q_projx")
    with pytest.raises(ConfigError) as e:
        trl_grpo.run(trl_grpo.parse(argv)[0], say=lambda *a, **k: None)
    assert str(e.value).startswith("--lora_target_modules=['q_projx']: 'q_projx' names no module of this model; ")
