"""Boundary values of every TRL GRPOConfig field, and the two verdicts on each (issue 46, deliverable 5).

``boundary_values(trl.GRPOConfig)`` lists, per field, the values a walk tries: 0, -1, 1, 2 for an integer,
those and 0.5 for a float, True and False for a bool, None where the annotation allows it, each named
choice of a Literal, an Enum or a ``choices`` list. ``trl_verdict`` builds TRL's GRPOConfig with one of them,
``grpokit_verdict`` builds grpokit.trl's and maps it (the config half of GRPOTrainer's construction, no model).
``values_table.json`` keeps the verdicts with TRL's 1-step run as the oracle (bench/trl_values_oracle.py).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import tempfile
import types
import typing
import warnings
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("values_table.json")
INT_VALUES = (0, -1, 1, 2)
FLOAT_VALUES = (0, -1, 1, 2, 0.5)


def _members(tp: Any) -> list:
    """The flat members of a union annotation."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(tp) for m in _members(a)]
    return [tp]


def values_for(tp: Any, choices: list | None) -> list:
    """The boundary values of one field annotated ``tp`` (``choices``: its metadata's named choices)."""
    out: list = []
    for m in _members(tp):
        if m is type(None):
            out.append(None)
        elif m is bool:
            out += [True, False]
        elif m is int:
            out += list(INT_VALUES)
        elif m is float:
            out += list(FLOAT_VALUES)
        elif typing.get_origin(m) is typing.Literal:
            out += list(typing.get_args(m))
        elif isinstance(m, type) and issubclass(m, enum.Enum):
            out += [e.value for e in m]
    out += list(choices or [])
    seen: list = []
    for v in out:  # 1 and True, 0 and False are different values here
        if not any(v == s and type(v) is type(s) for s in seen):
            seen.append(v)
    return seen


def boundary_values(config_cls: type) -> list[tuple[str, Any]]:
    """Every (field, value) pair the walk tries, in the class's field order."""
    hints = typing.get_type_hints(config_cls)
    pairs = []
    for f in dataclasses.fields(config_cls):
        if f.init and not f.name.startswith("_"):
            pairs += [(f.name, v) for v in values_for(hints[f.name], f.metadata.get("choices"))]
    return pairs


def _verdict(build) -> tuple[str, str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build()
    except Exception as e:  # the verdict is the error's first line
        return "refuse", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return "accept", ""


BASE = dict(  # a 1-step CPU run (bf16 off: TRL's default turns it on where it can); else TRL's defaults
    report_to="none",
    bf16=False,
    use_cpu=True,
    per_device_train_batch_size=2,
    per_device_eval_batch_size=2,
    num_generations=2,
    max_completion_length=8,
    max_steps=1,
    logging_steps=1,
    save_steps=1,
)


def base_args(out: str, name: str, value: Any) -> dict:
    """``BASE`` with output_dir ``out`` and ``name=value`` on top."""
    return {**BASE, "output_dir": out, name: value}


def trl_verdict(name: str, value: Any) -> tuple[str, str]:
    """TRL's GRPOConfig constructed with ``name=value`` (else TRL's defaults)."""
    import trl

    with tempfile.TemporaryDirectory() as out:
        return _verdict(lambda: trl.GRPOConfig(**base_args(out, name, value)))


def grpokit_verdict(name: str, value: Any) -> tuple[str, str]:
    """grpokit.trl's GRPOConfig constructed with ``name=value``, checked and mapped as GRPOTrainer does
    before it loads a model."""
    from grpokit.trl.config import GRPOConfig
    from grpokit.trl.mapping import to_config
    from grpokit.trl.trainer_args import checked_args

    def build():
        args = GRPOConfig(**base_args(out, name, value))
        checked_args(args, "model", None, None, None, (None, None))
        to_config(args, num_rows=64)

    with tempfile.TemporaryDirectory() as out:
        return _verdict(build)


def load_table() -> list[dict]:
    return json.loads(TABLE.read_text())["rows"]


def recorded_transformers() -> str:
    """The transformers version values_table.json and docs/TRL.md's tables were made with."""
    return json.loads(TABLE.read_text())["transformers"]


def other_versions() -> str:
    """Why the table cannot be compared here ("" where it can): it lists the fields and verdicts of the trl
    and transformers it was recorded with, and another transformers has other fields (5.17 has no
    activation_checkpointing); bench/trl_values_oracle.py records it again for the installed ones."""
    import transformers

    recorded = json.loads(TABLE.read_text())
    here = {"trl": _installed_trl(), "transformers": transformers.__version__}
    differ = [f"{k} {recorded.get(k)} (installed: {v})" for k, v in here.items() if v and recorded.get(k) != v]
    return "values_table.json was recorded with " + ", ".join(differ) if differ else ""


def _installed_trl() -> str | None:
    try:
        import trl
    except ImportError:
        return None
    return trl.__version__
