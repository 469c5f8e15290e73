"""bench/'s shared pieces: the rotation of sides (alternate.py) and the timing figures (timing.py)."""

import sys

from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from alternate import turns  # noqa: E402
from timing import median_ms, seconds, spread  # noqa: E402


def test_every_round_runs_each_side_once_and_the_order_rotates():
    assert list(turns(["a", "b", "c"], 3)) == [
        (0, "a"), (0, "b"), (0, "c"),
        (1, "b"), (1, "c"), (1, "a"),
        (2, "c"), (2, "a"), (2, "b"),
    ]  # fmt: skip
    assert list(turns([], 2)) == [] and list(turns(["x"], 0)) == []


def test_spread_of_five_times_worked_by_hand():
    # sorted 1 2 3 4 5: median 3; p90 is the value at index int(0.9 * 4) = 3, i.e. 4
    assert spread([5.0, 1.0, 3.0, 2.0, 4.0]) == {"median": 3.0, "min": 1.0, "max": 5.0, "p90": 4.0, "n": 5}


def test_seconds_returns_the_result_and_median_ms_calls_warmup_plus_reps():
    calls = []
    dt, out = seconds(lambda: calls.append(1) or "done")
    assert out == "done" and dt >= 0 and calls == [1]
    assert median_ms(lambda: calls.append(1), warmup=2, reps=3) >= 0 and len(calls) == 6
