"""``grpokit train --config run.yaml`` with a TRL-style YAML: the flat keys of ``trl grpo --config``.

A TRL-style file has no grpokit sections (model:, rollout: ...) but TRL's flat names: GRPOConfig's
arguments (``learning_rate``, ``num_generations`` ...), the script's (``dataset_name``,
``dataset_train_split``, ``reward_funcs``, ``reward_model_name_or_path``) and ModelConfig's
(``model_name_or_path``, ``dtype``, ``use_peft``, ``lora_r`` ...). It builds the same
``GRPOTrainer`` a Python script would (grpokit/trl/trainer.py), so both take the same argument names.

``reward_funcs`` entries are grpokit built-in names, ``module:function`` or TRL's dotted
``package.module.function`` (both found in the working directory too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from grpokit.config.sections import ConfigError
from grpokit.config.io import _sections
from .config import UNSUPPORTED, GRPOConfig

SCRIPT_DEFAULTS: dict[str, Any] = {  # TRL's ScriptArguments / GRPOScriptArguments / ModelConfig, with TRL's defaults
    "model_name_or_path": None, "dtype": "float32", "dataset_name": None, "dataset_config": None,
    "dataset_train_split": "train", "dataset_test_split": "test", "reward_funcs": None, "reward_model_name_or_path": None,
    "use_peft": False, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target_modules": None,
    "lora_task_type": "CAUSAL_LM", "attn_implementation": None,
}
SCRIPT_UNSUPPORTED: dict[str, Any] = {
    "model_revision": "main", "lora_target_parameters": None, "lora_modules_to_save": None,
    "use_rslora": False, "use_dora": False, "load_in_8bit": False, "load_in_4bit": False, "bnb_4bit_quant_type": "nf4",
    "use_bnb_nested_quant": False, "bnb_4bit_quant_storage": None, "dataset_streaming": False, "ignore_bias_buffers": False,
    "datasets": [],
}
TRL_REWARDS = {"accuracy_reward": "math_accuracy", "think_format_reward": "strict_format",
               "reasoning_accuracy_reward": "math_accuracy", "get_soft_overlong_punishment": "overlong_penalty"}


def is_trl_style(data: Any) -> bool:
    """A mapping with TRL's flat names and none of grpokit's sections."""
    if not isinstance(data, dict) or not data or any(k in _sections() for k in data):
        return False
    known = set(SCRIPT_DEFAULTS) | set(SCRIPT_UNSUPPORTED) | set(UNSUPPORTED) | set(GRPOConfig().to_dict())
    return any(k in known for k in data)


def read(path: str | Path) -> dict[str, Any] | None:
    """The file's mapping when it is TRL-style, else None (a grpokit config file)."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError:
        return None
    return data if is_trl_style(data) else None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``name=value`` overrides with TRL's names (values parsed as YAML)."""
    out = dict(data)
    for item in overrides:
        if "=" not in item or "." in item.split("=", 1)[0]:
            raise ConfigError(f"override {item!r} does not fit a TRL-style config; write name=value with a TRL argument name (e.g. learning_rate=1e-6)")
        key, raw = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(raw) if raw != "" else None
    return out


def build_trainer(data: dict[str, Any], *, out: str | None = None, callbacks: list | None = None):
    """The ``GRPOTrainer`` a TRL script with these arguments would build."""
    from .trainer import GRPOTrainer

    script = {k: data.get(k, v) for k, v in SCRIPT_DEFAULTS.items()}
    for key, default in SCRIPT_UNSUPPORTED.items():
        if key in data and data[key] not in (default, None):
            raise ConfigError(f"{key}={data[key]!r} is not supported by grpokit; leave it at TRL's default {default!r}")
    args_kw = {k: v for k, v in data.items() if k not in SCRIPT_DEFAULTS and k not in SCRIPT_UNSUPPORTED}
    if out:
        args_kw["output_dir"] = out
    if script["dtype"] not in (None, "auto", "float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype={script['dtype']!r} is not valid; use auto, float32, bfloat16 or float16")
    # as TRL's grpo.py: the ModelConfig's dtype and attn_implementation, then model_init_kwargs' own keys win
    args_kw["model_init_kwargs"] = {"dtype": script["dtype"] or "auto", "attn_implementation": script["attn_implementation"],
                                    **(args_kw.get("model_init_kwargs") or {})}
    args = GRPOConfig(**args_kw)
    if not script["model_name_or_path"]:
        raise ConfigError("the TRL-style config has no model_name_or_path; name the model to train")
    if not script["dataset_name"]:
        raise ConfigError("the TRL-style config has no dataset_name; give a .jsonl/.json/.parquet/.csv file or a hub dataset")
    train = _dataset(script["dataset_name"], script["dataset_config"], script["dataset_train_split"])
    evals = _dataset(script["dataset_name"], script["dataset_config"], script["dataset_test_split"]) if args.eval_strategy != "no" else None
    funcs = ([script["reward_model_name_or_path"]] if script["reward_model_name_or_path"] else []) + \
        [_reward(name) for name in script["reward_funcs"] or []]
    peft = None
    if script["use_peft"]:
        from peft import LoraConfig

        peft = LoraConfig(r=script["lora_r"], lora_alpha=script["lora_alpha"], lora_dropout=script["lora_dropout"],
                          target_modules=script["lora_target_modules"], task_type=script["lora_task_type"])
    return GRPOTrainer(model=script["model_name_or_path"], reward_funcs=funcs, args=args, train_dataset=train,
                       eval_dataset=evals, peft_config=peft, callbacks=callbacks)


def _dataset(name: str, config: str | None, split: str):
    import datasets

    from grpokit.data.prompts import FILE_BUILDERS

    path = Path(name).expanduser()
    if path.suffix in FILE_BUILDERS:
        if not path.is_file():
            raise ConfigError(f"dataset_name={name!r} does not exist; give an existing .jsonl/.json/.parquet/.csv file or a hub dataset")
        if split != "train":  # a local file is one split
            raise ConfigError(f"dataset_name={name!r} is one file; set eval_strategy=no or give a hub dataset with a {split!r} split")
        return datasets.load_dataset(FILE_BUILDERS[path.suffix], data_files=str(path), split="train")
    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as e:  # network, unknown name or split: one sentence
        raise ConfigError(f"could not load dataset {name!r} split {split!r} ({type(e).__name__}: {e})") from None


def _reward(name: str):
    from grpokit.rewards.spec import BUILTINS, RewardError, resolve_reward

    if name in TRL_REWARDS:
        raise ConfigError(f"reward_funcs entry {name!r} is TRL's own reward; use grpokit's {TRL_REWARDS[name]!r} "
                          f"or TRL's by its import path (trl.rewards.{name})")
    if ":" not in name and name not in BUILTINS:
        if "." not in name:
            raise ConfigError(f"reward_funcs entry {name!r} is neither a grpokit built-in ({', '.join(BUILTINS)}) nor an import path")
        module, _, attr = name.rpartition(".")
        name = f"{module}:{attr}"  # TRL's dotted path
    try:
        return resolve_reward(name)
    except RewardError as e:
        raise ConfigError(f"reward_funcs: {e}") from None
