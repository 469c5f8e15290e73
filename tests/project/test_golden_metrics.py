"""Every variant's metrics for 2 deterministic CPU steps equal the record
(tests/golden/variant_metrics.json, written by scripts/golden_metrics.py). A change
here is a change of a number: it needs a reason in the commit and a re-record of that variant only
(``python scripts/golden_metrics.py --write`` re-records all; edit the JSON for one)."""

import importlib.util
import json

import pytest

from helpers.paths import ROOT

SCRIPT = ROOT / "scripts" / "golden_metrics.py"
_spec = importlib.util.spec_from_file_location("golden_metrics", SCRIPT)
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)
RECORD = json.loads(golden.GOLDEN.read_text())


def test_every_variant_is_recorded():
    assert sorted(RECORD) == sorted(golden.variants())


@pytest.mark.parametrize("name", sorted(golden.variants()))
def test_variant_metrics_unchanged(name):
    differences = golden.diff(RECORD[name], golden.run_one(golden.variants()[name]))
    assert not differences, f"{name}: " + "; ".join(differences[:10])
