"""TRL's script helpers without TRL: ``ScriptArguments``, the dataset mixture, ``TrlParser``.

A TRL script starts ``TrlParser((ScriptArguments, GRPOConfig, ModelConfig)).parse_args_and_config()``.
Here each class has TRL 1.16's fields, types and defaults, and ``TrlParser`` is transformers'
``HfArgumentParser`` plus what TRL adds: ``none`` / ``null`` read as None for an optional field of one
non-text value (``--epsilon_high none``), ``--config run.yaml`` whose keys become the parser's defaults
(a command-line flag still wins), an ``env:`` mapping exported to the environment, the keys no
dataclass has either refused or handed back, and the same ``subparsers.add_parser(..., dataclass_types=)``
as TRL's CLI. ``get_dataset`` loads and mixes ``DatasetMixtureConfig.datasets`` as TRL's does.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from transformers import HfArgumentParser

from grpokit.config.base import ConfigError

log = logging.getLogger("grpokit.trl")


@dataclass
class ScriptArguments:
    """The dataset arguments of TRL's scripts."""

    dataset_name: str | None = field(default=None, metadata={"help": "Hub id or local path of the dataset."})
    dataset_config: str | None = field(default=None, metadata={"help": "Configuration (subset) of the dataset."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str = field(default="test", metadata={"help": "Split to evaluate on."})
    dataset_streaming: bool = field(default=False, metadata={"help": "Stream the dataset instead of downloading it."})
    ignore_bias_buffers: bool = field(
        default=False,
        metadata={
            "help": "Leave boolean bias buffers out of distributed parameter syncing (a fix for some DDP models)."
        },
    )


@dataclass
class DatasetConfig:
    """One dataset of a mixture: ``datasets.load_dataset``'s own arguments, plus columns to keep and a share."""

    path: str = field(metadata={"help": "Hub id, local folder or builder name (json, parquet ...)."})
    name: str | None = field(default=None, metadata={"help": "Configuration (subset)."})
    data_dir: str | None = field(default=None, metadata={"help": "Folder of the data files inside path."})
    data_files: str | list[str] | dict[str, str] | None = field(default=None, metadata={"help": "Data files to load."})
    split: str = field(default="train", metadata={"help": "Split to load."})
    columns: list[str] | None = field(default=None, metadata={"help": "Columns to keep (None: all)."})
    fraction: float | None = field(
        default=None, metadata={"help": "Share of the mixture (normalised over the datasets; set for all or none)."}
    )


@dataclass
class DatasetMixtureConfig:
    """Several datasets loaded and concatenated into one (``get_dataset``)."""

    datasets: list[DatasetConfig] = field(
        default_factory=list,
        metadata={"help": "The datasets, each a mapping of DatasetConfig's fields (in a YAML config)."},
    )
    streaming: bool = field(default=False, metadata={"help": "Stream the datasets."})
    test_split_size: float | None = field(
        default=None, metadata={"help": "Split the mixture into train and test with this test size (None: train only)."}
    )

    def __post_init__(self) -> None:
        self.datasets = [DatasetConfig(**d) if isinstance(d, dict) else d for d in self.datasets]


def get_dataset(mixture_config: DatasetMixtureConfig) -> Any:
    """A ``datasets.DatasetDict`` of the mixture: each dataset loaded (columns selected), cut to its share of
    the mixture when fractions are set (the largest mixture that takes no dataset past its length), then
    concatenated; split into train and test when ``test_split_size`` is set, else only "train"."""
    import datasets

    parts = []
    for d in mixture_config.datasets:
        ds = datasets.load_dataset(
            path=d.path,
            name=d.name,
            data_dir=d.data_dir,
            data_files=d.data_files,
            split=d.split,
            streaming=mixture_config.streaming,
        )
        parts.append(ds if d.columns is None else ds.select_columns(d.columns))
    if not parts:
        raise ConfigError("the dataset mixture has no datasets; list at least one under datasets")
    shares = [d.fraction for d in mixture_config.datasets]
    if any(s is not None for s in shares):
        if any(s is None for s in shares):
            raise ConfigError("fraction is set for some datasets of the mixture but not all; set it for all or none")
        if mixture_config.streaming:
            raise ConfigError("fraction cannot be used with streaming datasets (their length is unknown)")
        weights = [s / sum(shares) for s in shares]
        total = min(len(ds) / w for ds, w in zip(parts, weights) if w > 0)
        parts = [ds.select(range(round(w * total))) for ds, w in zip(parts, weights)]
    mixed = datasets.concatenate_datasets(parts)
    if mixture_config.test_split_size is not None:
        return mixed.train_test_split(test_size=mixture_config.test_split_size)
    return datasets.DatasetDict({"train": mixed})


def init_zero_verbose() -> None:
    """Quiet logging for command-line tools: errors only, and Python warnings sent through logging."""
    import warnings

    logging.basicConfig(format="%(message)s", datefmt="[%X]", level=logging.ERROR)

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        logging.warning("%s:%s: %s: %s", filename, lineno, category.__name__, message)

    warnings.showwarning = show


class TrlParser(HfArgumentParser):
    """transformers' ``HfArgumentParser`` that also reads ``--config FILE.yaml`` as TRL's ``TrlParser``."""

    def __init__(self, dataclass_types: Any = None, **kwargs: Any):
        if dataclass_types is None:
            dataclass_types = []
        elif not isinstance(dataclass_types, Iterable):
            dataclass_types = [dataclass_types]
        for cls in dataclass_types:
            if "config" in cls.__dataclass_fields__:
                raise ConfigError(
                    f"dataclass {cls.__name__} has a field named 'config', which TrlParser keeps for "
                    "the --config file; rename the field"
                )
        super().__init__(dataclass_types=dataclass_types, **kwargs)

    @staticmethod
    def _parse_dataclass_field(parser: argparse.ArgumentParser, field: Any) -> None:
        """transformers' argument for the field; for an optional field of one non-text value (``float | None``,
        not a list, a choice or a bool) ``none`` / ``null`` in any case read as None, as TRL's parser reads them
        (``--epsilon_high none``). A text field keeps ``none`` as text (``--report_to none``)."""
        optional = _optional_non_bool(field.type)  # before transformers takes None out of field.type
        HfArgumentParser._parse_dataclass_field(parser, field)
        if optional:
            action = next(a for a in reversed(parser._actions) if a.dest == field.name)
            plain = action.nargs is None and action.choices is None and callable(action.type)
            if plain and action.type is not str:
                action.type = _none_or(action.type)

    def parse_args_and_config(
        self,
        args: Iterable[str] | None = None,
        return_remaining_strings: bool = False,
        fail_with_unknown_args: bool = True,
        separate_remaining_strings: bool = False,
    ) -> tuple:
        """The dataclasses from the command line over ``--config``'s values over the fields' defaults."""
        args = list(args) if args is not None else sys.argv[1:]
        from_config: list[str] = []
        if "--config" in args:
            at = args.index("--config")
            if at + 1 >= len(args):
                raise ConfigError("--config needs a YAML file path after it")
            path = args[at + 1]
            del args[at : at + 2]
            from_config = self.set_defaults_with_config(**_read_yaml(path))
        out = self.parse_args_into_dataclasses(args=args, return_remaining_strings=return_remaining_strings)
        if return_remaining_strings:
            rest = list(out[-1])
            return out[:-1] + ((from_config, rest) if separate_remaining_strings else (from_config + rest,))
        if fail_with_unknown_args and from_config:
            raise ConfigError(
                f"the config file has keys no argument takes: {from_config[::2]}; remove them or "
                "parse with fail_with_unknown_args=False"
            )
        return out

    def set_defaults_with_config(self, **kwargs: Any) -> list[str]:
        """Make each key a default of the argument of that name (subparsers too, no longer required);
        the keys no argument takes come back as ``["--key", "value", ...]``."""
        used = _apply_defaults(self, kwargs)
        return [item for key, value in kwargs.items() if key not in used for item in (f"--{key}", str(value))]


def _optional_non_bool(tp: Any) -> bool:
    """``X | None`` (or ``Optional[X]``) with X not bool: a union holding NoneType and no bool."""
    import types
    import typing

    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    return union and type(None) in typing.get_args(tp) and bool not in typing.get_args(tp)


def _none_or(convert: Any) -> Any:
    """``convert`` that reads ``none`` / ``null`` (any case) as None."""

    def read(text: str) -> Any:
        return None if text.lower() in ("none", "null") else convert(text)

    read.__name__ = getattr(convert, "__name__", "value")  # argparse's "invalid float value" names the type
    return read


def _apply_defaults(parser: argparse.ArgumentParser, values: dict[str, Any]) -> set[str]:
    used: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                used |= _apply_defaults(sub, values)
        elif action.dest in values:
            action.default, action.required = values[action.dest], False
            used.add(action.dest)
    return used


def _read_yaml(path: str) -> dict[str, Any]:
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read the config file {path!r} ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"the config file {path!r} is not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"the config file {path!r} must hold a YAML mapping of argument names to values")
    env = data.pop("env", {})
    if not isinstance(env, dict):
        raise ConfigError(f"env in the config file {path!r} must be a mapping of variable names to values")
    for key, value in env.items():
        os.environ[key] = str(value)
    return data
