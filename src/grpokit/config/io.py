"""Building a config: from nested dicts and YAML, dotted command-line overrides, field docs for
``--help``, and saving the resolved config. The sections themselves are in config.py."""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import inspect
import textwrap
import typing
from pathlib import Path
from typing import Any

import yaml


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def assigned(cfg: Config) -> set[str]:
    """Dotted names of the fields that were assigned rather than left at their defaults."""
    return {f"{name}.{f}" for name in _sections() for f in (getattr(getattr(cfg, name), "_assigned", None) or ())}


def from_dict(data: dict[str, Any], base: Config | None = None, source: str = "the config") -> Config:
    """Apply a nested dict (e.g. parsed YAML) on top of ``base`` (default: the defaults). ``source`` names it in the
    sentence refusing one field given in both its spellings (``one_spelling``)."""
    cfg = base if base is not None else Config()
    for section, values in (data or {}).items():
        if section not in _sections():
            raise ConfigError(f"unknown config section {section!r}; valid sections: {', '.join(_sections())}")
        if not isinstance(values, dict):
            raise ConfigError(f"config section {section!r} must be a mapping of fields, got {values!r}")
    one_spelling([f"{section}.{name}" for section, values in (data or {}).items() for name in values], source)
    for section, values in (data or {}).items():
        for name, value in values.items():
            set_field(cfg, f"{section}.{name}", value)
    return cfg


def one_spelling(keys: list[str], source: str) -> None:
    """Refuse one layer of settings (a config file, one command line's overrides: ``keys``, their dotted names) that
    gives a field in both its spellings (retired.py SPELLINGS): the later would win silently, by where it stands. A
    later layer still wins over an earlier one, in either spelling."""
    for old, new in SPELLINGS.items():
        if old in keys and new in keys:
            raise ConfigError(f"{source} gives both {old} and {new}: {old} is {new}'s other spelling; give only {new}")


def strict_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load`` that refuses a key given twice in one mapping (a section, a field in a section),
    naming it and both lines: YAML keeps the last silently, and the other value would be lost unseen.
    ``source`` names the text in the sentence ("config file 'x.yaml'"). Other YAML errors are raised as is."""
    dup = _duplicate_key(yaml.compose(text, Loader=yaml.SafeLoader))
    if dup is not None:
        key, first, second = dup
        where = f"line {first} and line {second}" if first != second else f"both on line {first}"
        raise ConfigError(
            f"{source} gives the key {key!r} twice ({where}); YAML would keep only the last one silently, "
            "so remove or merge one of them"
        )
    return yaml.safe_load(text)


def _duplicate_key(root: yaml.Node | None) -> tuple[str, int, int] | None:
    """The first key given twice in a mapping of the node tree: (dotted path, line, line)."""
    stack, seen_nodes = [(root, "")], set()
    while stack:
        node, path = stack.pop()
        if node is None or id(node) in seen_nodes:  # anchors and aliases share nodes (and may loop)
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if key.tag == "tag:yaml.org,2002:merge" or not isinstance(key, yaml.ScalarNode):
                    stack.append((value, path))
                    continue
                name, line = f"{path}{key.value}", key.start_mark.line + 1
                if (key.tag, key.value) in lines:
                    return name, lines[(key.tag, key.value)], line
                lines[(key.tag, key.value)] = line
                stack.append((value, f"{name}."))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, path) for item in node.value)
    return None


def load_yaml(path: str | Path, base: Config | None = None) -> Config:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass --config with a path to a YAML file")
    try:
        data = strict_yaml(p.read_text(), f"config file {str(p)!r}") or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections, got {type(data).__name__}")
    return from_dict(data, base, f"config file {str(p)!r}")


def apply_overrides(cfg: Config, overrides: list[str], source: str = "the command line") -> Config:
    """Apply ``section.field=value`` strings; values are parsed as YAML scalars/lists. ``source`` names them in the
    sentence refusing one field given in both its spellings (``one_spelling``)."""
    one_spelling([item.split("=", 1)[0].strip() for item in overrides], source)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.field=value (e.g. rollout.group_size=16)")
        key, raw = item.split("=", 1)
        try:
            value = strict_yaml(raw, f"override {item!r}") if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        set_field(cfg, key.strip(), value)
    return cfg


def set_field(cfg: Config, dotted: str, value: Any) -> None:
    """Set ``section.field`` with type coercion and a clear error for unknown names or types (another spelling of
    a field, retired.py SPELLINGS, sets that field, and the config notes which spelling set it: note_spelling)."""
    spelled, dotted = dotted, SPELLINGS.get(dotted, dotted)
    parts = dotted.split(".")
    if len(parts) > 2 and parts[0] in _sections() and _field_types(type(getattr(cfg, parts[0]))).get(parts[1]) is dict:
        return _set_inside(cfg, parts, value)
    if len(parts) != 2 or parts[0] not in _sections():
        raise ConfigError(
            f"unknown config field {dotted!r}; fields look like section.name with section one of "
            f"{', '.join(_sections())}"
        )
    section_obj = getattr(cfg, parts[0])
    types = _field_types(type(section_obj))
    if parts[1] not in types and (retired := retired_field(dotted, value)) is not None:
        if retired:
            raise ConfigError(retired)
        return  # a retired field at its neutral value (an older config.yaml): nothing to set
    if parts[1] not in types:
        raise ConfigError(f"unknown config field {dotted!r}; valid fields of {parts[0]}: {', '.join(types)}")
    setattr(section_obj, parts[1], _coerce(dotted, value, types[parts[1]]))
    note_spelling(section_obj, parts[1], spelled)


def _set_inside(cfg: Config, parts: list[str], value: Any) -> None:
    """``section.mapping.key[.key...]=value`` for a mapping field (data.domains.math.share=2): the key is set
    inside a copy of the mapping (created on the way where missing), which is then assigned."""
    section_obj = getattr(cfg, parts[0])
    top = dict(getattr(section_obj, parts[1]) or {})
    node = top
    for i, key in enumerate(parts[2:-1], start=2):
        inner = node.get(key)
        if inner is not None and not isinstance(inner, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"{where} is {inner!r}, not a mapping, so {'.'.join(parts)} cannot be set")
        node[key] = node = dict(inner or {})
    node[parts[-1]] = value
    setattr(section_obj, parts[1], top)


def _coerce(name: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is list:
        (inner,) = typing.get_args(tp)
        if value is None or value == "":
            return []
        items = value if isinstance(value, list) else [value]
        return [_coerce(name, v, inner) for v in items]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                return float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{name} must be a number, got {value!r}") from None
        return float(value)
    if tp is str:
        return "" if value is None else str(value)
    if tp is dict:
        if value is None or value == "":
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"{name} must be a mapping, got {value!r}")
        return value
    return value


def _sections() -> list[str]:
    return [f.name for f in dataclasses.fields(Config)]


@functools.cache  # a section's annotations never change; get_type_hints costs ~5 ms a call (set_field runs often)
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass, read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
                docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def describe_fields(cfg: Config | None = None) -> str:
    """Every field with its current value and docstring, for ``grpokit train --help``."""
    cfg = cfg or Config()
    lines = []
    for section in _sections():
        obj = getattr(cfg, section)
        lines.append(f"{section}: {field_docs(Config).get(section, '')}")
        docs = field_docs(type(obj))
        for f in dataclasses.fields(obj):
            lines.append(f"  {section}.{f.name} = {getattr(obj, f.name)!r}\n      {docs.get(f.name, '')}")
    return "\n".join(lines)


def save_yaml(cfg: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


# A run's config.yaml and config_history.yaml carry the sha256 of the rest of the file on their first
# line, a YAML comment: a resume reads them back and must tell a file cut short (its last line becoming
# `- grad_`, which is still YAML) from the file the run wrote. The first line survives a cut from the
# end; a file without it was written before checksums (it can only be read as it is).
SEAL = "# grpokit sha256 of the lines below: "


def sealed(text: str) -> str:
    """``text`` with its checksum line in front (see SEAL)."""
    return f"{SEAL}{hashlib.sha256(text.encode('utf-8')).hexdigest()}\n{text}"


def unsealed(text: str, source: str, doing: str = "resuming") -> tuple[str, bool]:
    """The text after the checksum line, and whether it had one; ConfigError naming ``source`` when the
    text does not match its checksum (torn, damaged, or edited by hand), to be restored before ``doing``."""
    if not text.startswith(SEAL):
        return text, False
    first, _, body = text.partition("\n")
    if hashlib.sha256(body.encode("utf-8")).hexdigest() != first[len(SEAL) :].strip():
        raise ConfigError(
            f"{source} does not match the sha256 on its first line, so it is torn or damaged (or was edited by "
            f"hand); restore it from a copy (to keep a deliberate edit, delete that first line) before {doing}"
        )
    return body, True


# Last, so that either module may be imported first: config.py re-exports this module's functions
# (``from grpokit.config import apply_overrides`` is public API) and these functions read its classes.
from .retired import SPELLINGS, note_spelling, retired_field  # noqa: E402
from .sections import Config, ConfigError  # noqa: E402
