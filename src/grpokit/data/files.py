"""Reading a local text data file (.jsonl, .json, .csv) into rows, after checks that make a malformed
file end in one sentence naming the file, the line and what would be valid, not in a traceback.

Values arrive as written, never re-typed: a CSV cell is the string in the file ("007", "NA", "" and
"12345678901234567891" stay those strings; ``datasets``' pandas reader guessed types column by column,
so one decimal made every answer a float and "NA" became None), and a JSON value is what JSON says (7 is
an int, "007" a string, 1.5 a float; ``datasets``' pyarrow reader unified a column's types, turning 7
into 7.0 beside a 1.5 and "007" into 7 beside an int). A row lacking a column gets None for it, as
``datasets`` gives. Parquet carries its own column types and is read by ``datasets``.

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


def read_rows(path: Path, source: str) -> list[dict]:
    """The rows of the text file at ``path`` (.jsonl, .json or .csv), values as written; ConfigError (one
    sentence) when it cannot give rows."""
    text = check_file(path, source)
    if path.suffix == ".csv":
        rows = list(csv.DictReader(io.StringIO(text)))
    elif path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = _json_rows(text, source)
    return _rectangular(rows)


def _json_rows(text: str, source: str) -> list[dict]:
    try:
        data = json.loads(text)
    except ValueError:  # JSON lines in a .json file (checked by check_file)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, list):
        return data
    lengths = {len(v) for v in data.values()}
    if len(lengths) > 1:
        raise ConfigError(
            f"data file {source!r} is a mapping of columns of different lengths "
            f"({', '.join(f'{k}: {len(v)}' for k, v in data.items())}); give every column one value per row"
        )
    return [dict(zip(data, values)) for values in zip(*data.values())]


def _rectangular(rows: list[dict]) -> list[dict]:
    """Every row with every column (in first-seen order): a column a row lacks is None there."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in columns} for r in rows]


def check_file(path: Path, source: str) -> str:
    """The text of the file at ``path``; ConfigError (one sentence) when it cannot give rows. A binary
    file (parquet) is left to its reader: ""."""
    if path.suffix not in TEXT_SUFFIXES:
        return ""
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
    return text


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
