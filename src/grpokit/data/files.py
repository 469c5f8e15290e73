"""Checks of a local data file before ``datasets`` reads it, so that a malformed file ends in one
sentence naming the file, the line and what would be valid, not in a pyarrow traceback.

Text formats (.jsonl, .json, .csv) must be UTF-8 (a leading byte-order mark, which Windows editors
write, is allowed: ``datasets`` reads past it too) and hold at least one row; every line of a
.jsonl file must be one JSON object; every row of a .csv file must have the header's number of
fields. Parquet is binary and checked by its reader (its errors are turned into a sentence by
``prompts.load_rows``).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from pathlib import Path

from grpokit.config.sections import ConfigError

TEXT_SUFFIXES = (".jsonl", ".json", ".csv")
# longest first: the UTF-32 little-endian mark begins with the UTF-16 one
_OTHER_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def check_file(path: Path, source: str) -> None:
    """Raise ConfigError (one sentence) when the text file at ``path`` cannot give rows."""
    if path.suffix not in TEXT_SUFFIXES:
        return
    raw = path.read_bytes()
    raw = raw.removeprefix(codecs.BOM_UTF8)  # a byte-order mark: read past (line 1 was "not valid JSON")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bom = next((name for mark, name in _OTHER_BOMS if raw.startswith(mark)), None)
        if bom is not None:  # a Windows "Unicode" save: the mark names the encoding, say so
            raise ConfigError(
                f"data file {source!r} is {bom} text (it starts with a {bom} byte-order mark), not UTF-8; "
                "save it as UTF-8"
            ) from None
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"data file {source!r} is not UTF-8 text (byte {raw[e.start]:#04x} on line {line}); save it as UTF-8"
        ) from None
    if not text.strip():
        raise ConfigError(f"data file {source!r} is empty; it needs at least one row")
    if path.suffix == ".jsonl":
        _check_jsonl(text, source)
    elif path.suffix == ".csv":
        _check_csv(text, source)
    else:
        _check_json(text, source)


def _check_jsonl(text: str, source: str) -> None:
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise ConfigError(
                f"line {n} of data file {source!r} is not valid JSON; every line of a .jsonl file "
                "must be one JSON object"
            ) from None
        if not isinstance(obj, dict):
            raise ConfigError(
                f"line {n} of data file {source!r} is a JSON {type(obj).__name__}, not an object; "
                "every line of a .jsonl file must be one JSON object (a row)"
            )


def _check_json(text: str, source: str) -> None:
    try:
        data = json.loads(text)
    except ValueError:  # datasets also reads JSON lines from a .json file
        return _check_jsonl(text, source)
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        return  # columns: {"prompt": [...], "answer": [...]}
    if not isinstance(data, list) or not data or not all(isinstance(r, dict) for r in data):
        raise ConfigError(
            f"data file {source!r} must hold a non-empty JSON list of objects (rows), a mapping of columns, "
            "or one object per line"
        )


def _check_csv(text: str, source: str) -> None:
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:
        raise ConfigError(f"data file {source!r} is not valid CSV ({e})") from None
    rows = [(n, r) for n, r in enumerate(rows, 1) if r]
    header = rows[0][1]
    if len(rows) < 2:
        raise ConfigError(f"data file {source!r} has a header but no rows; it needs at least one row under the header")
    if len(set(header)) != len(header) or not all(h.strip() for h in header):
        raise ConfigError(f"the header of data file {source!r} has empty or repeated column names: {header}")
    for n, r in rows[1:]:
        if len(r) != len(header):
            raise ConfigError(
                f"row {n} of data file {source!r} has {len(r)} fields but the header has {len(header)}; "
                "give every row one field per column"
            )
