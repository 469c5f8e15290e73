"""Stand-ins for TRL's example scripts, loaded by Python at start-up (bench/trl_examples.py puts this
folder first on PYTHONPATH). The same for both sides, trl and grpokit.trl:

- ``datasets.load_dataset(<hub name>, ...)`` of a name in TRL_EX_DATASETS (a JSON map name -> folder
  of parquet splits with the real columns) reads the local folder, split slices ("train[:5%]") included;
- models come from the offline hub cache the harness wrote (HF_HUB_CACHE, HF_HUB_OFFLINE=1);
- ``GRPOConfig`` of both packages gets CPU-size overrides (TRL_EX_OVERRIDES, JSON) on top of what the
  script and its command line give, so every run is two optimizer steps of tiny batches;
- ``GRPOTrainer.train`` writes what the table compares (steps, log keys, checkpoints) to TRL_EX_REPORT.

Nothing here runs unless TRL_EX_REPORT is set.
"""

from __future__ import annotations

import atexit
import importlib.abc
import json
import os
import sys
from pathlib import Path

REPORT = os.environ.get("TRL_EX_REPORT")


def _patch_datasets(module) -> None:
    table = json.loads(os.environ.get("TRL_EX_DATASETS", "{}"))
    original = module.load_dataset

    def load_dataset(path, name=None, *args, split=None, **kwargs):
        folder = table.get(str(path))
        if folder is None:
            return original(path, name, *args, split=split, **kwargs)
        files = {p.stem: str(p) for p in Path(folder).glob("*.parquet")}
        return original("parquet", data_files=files, split=split)

    module.load_dataset = load_dataset


def _patch_config(cls) -> None:
    overrides = json.loads(os.environ.get("TRL_EX_OVERRIDES", "{}"))
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        if args:  # output_dir given by position
            kwargs["output_dir"], args = args[0], args[1:]
        init(self, *args, **{**kwargs, **overrides})

    cls.__init__ = __init__


def _patch_trainer(cls) -> None:
    train = cls.train

    def train_and_report(self, *args, **kwargs):
        out = train(self, *args, **kwargs)
        state = self.state
        keys = sorted({k for entry in state.log_history for k in entry})
        record = {"steps": state.global_step, "log_keys": keys, "output_dir": str(self.args.output_dir)}
        Path(REPORT).write_text(json.dumps(record))
        return out

    cls.train = train_and_report


def _at_exit() -> None:  # checkpoints as the script left them (it may save after train())
    if REPORT and Path(REPORT).exists():
        record = json.loads(Path(REPORT).read_text())
        out = Path(record["output_dir"])
        record["checkpoints"] = sorted(p.name for p in out.glob("checkpoint-*")) if out.is_dir() else []
        Path(REPORT).write_text(json.dumps(record))


def _after_import(name: str, module) -> None:
    if name == "datasets":
        _patch_datasets(module)
    elif name == "grpokit.trl":
        _patch_config(module.GRPOConfig)
        _patch_trainer(module.GRPOTrainer)
    elif name == "trl.trainer.grpo_config":  # trl's package imports lazily: patch where the classes are defined
        _patch_config(module.GRPOConfig)
    elif name == "trl.trainer.grpo_trainer":
        _patch_trainer(module.GRPOTrainer)


class _Hook(importlib.abc.MetaPathFinder):
    """Patches a watched module right after it is executed."""

    watched = {"datasets", "grpokit.trl", "trl.trainer.grpo_config", "trl.trainer.grpo_trainer"}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.watched:
            return None
        self.watched = self.watched - {fullname}
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                execute = spec.loader.exec_module

                def exec_module(module, execute=execute, fullname=fullname):
                    execute(module)
                    _after_import(fullname, module)

                spec.loader.exec_module = exec_module
                return spec
        return None


if REPORT:
    sys.meta_path.insert(0, _Hook())
    atexit.register(_at_exit)
