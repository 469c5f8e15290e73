"""Property-based fuzzing of the user's inputs (docs/FAULTS.md): any dotted override of any
config field, and any JSONL/CSV file given as data, ends in a value or in one sentence
(ConfigError), never in another exception. The CI run keeps each property to a few dozen examples;
`make fuzz` runs the same properties as a long soak (GRPOKIT_FUZZ=soak)."""

import dataclasses
import json
import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from grpokit.config.io import apply_overrides, from_dict  # noqa: E402
from grpokit.config.sections import Config, ConfigError, DataConfig  # noqa: E402
from grpokit.data.prompts import load_rows  # noqa: E402
from grpokit.validation import validate  # noqa: E402

settings.register_profile("ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "soak",
    max_examples=int(os.environ.get("GRPOKIT_FUZZ_EXAMPLES", "3000")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("soak" if os.environ.get("GRPOKIT_FUZZ") == "soak" else "ci")

FIELDS = [f"{s.name}.{f.name}" for s in dataclasses.fields(Config) for f in dataclasses.fields(s.default_factory())]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
RAW = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)  # text as typed, YAML or not


def one_sentence_or_value(build) -> None:
    try:
        cfg = build()
    except ConfigError as e:  # the one-sentence error: one line, naming something
        msg = str(e)
        assert msg and "\n" not in msg.strip(), msg
        return
    assert isinstance(cfg, Config)


@given(field=st.sampled_from(FIELDS), value=VALUES)
def test_any_typed_value_of_any_field_is_a_config_or_one_sentence(field, value):
    section, name = field.split(".")
    one_sentence_or_value(lambda: validate(from_dict({section: {name: value}})))


@given(field=st.sampled_from(FIELDS + ["train.nosuch", "nosection.x", "train", ""]), raw=RAW)
def test_any_override_text_is_a_config_or_one_sentence(field, raw):
    one_sentence_or_value(lambda: validate(apply_overrides(Config(), [f"{field}={raw}"])))


def _rows_or_sentence(suffix: str, content: bytes, prompt_column: str = "prompt") -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"data{suffix}"
        path.write_bytes(content)
        try:
            rows = load_rows(str(path), "train", DataConfig(prompt_column=prompt_column, answer_column=""))
        except ConfigError as e:
            assert str(e) and "\n" not in str(e).strip(), str(e)
            return
    assert rows and all(r["prompt"] is not None for r in rows)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=5,
)
JSONL_LINES = st.lists(
    st.one_of(
        st.dictionaries(st.sampled_from(["prompt", "answer", "x"]), JSON_VALUES, max_size=3).map(json.dumps),
        JSON_VALUES.map(json.dumps),
        st.text(max_size=15),
    ),
    max_size=5,
)


@given(lines=JSONL_LINES, tail=st.binary(max_size=4))
def test_any_jsonl_file_gives_rows_or_one_sentence(lines, tail):
    _rows_or_sentence(".jsonl", "\n".join(lines).encode("utf-8") + tail)


CSV_CELLS = st.text(alphabet=st.sampled_from(list('ab1 ,"\n\xe9')), max_size=6)


@given(
    header=st.lists(st.sampled_from(["prompt", "answer", "x", ""]), min_size=0, max_size=3),
    rows=st.lists(st.lists(CSV_CELLS, max_size=4), max_size=4),
    encoding=st.sampled_from(["utf-8", "latin-1"]),
)
def test_any_csv_file_gives_rows_or_one_sentence(header, rows, encoding):
    text = "\n".join(",".join(r) for r in [header, *rows])
    _rows_or_sentence(".csv", text.encode(encoding, errors="replace"))
