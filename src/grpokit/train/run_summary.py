"""summary.json: where a run stands, in two kinds of keys.

* What the run's history holds: ``eval_before`` (the held-out score before its first step) and
  ``earlier_sessions`` (how each earlier session of a resumed run ended: the end keys it had, in order).
* How the last session ENDED (``END_KEYS``): ``steps`` (the step it ended at: present only once it has
  ended), ``eval_after`` (its final held-out evaluation), ``interrupted`` / ``stop_signal`` (a signal stopped
  it), ``eval_owed`` (the step whose held-out evaluation that stop cut: ``--resume`` runs it first) and
  ``failed`` (the error that ended it, train/rank_failure.py).

A resume takes the folder again (``reopen``): every end key leaves the file at once, kept under
``earlier_sessions``, so a run resumed and then killed, or read while it trains, never shows the earlier
session's end as its own (the doctor would name a failure or a signal that was already dealt with, the report
an ``eval_after`` measured steps ago). A session's end is written only through ``end``, which refuses a key
that is not in ``END_KEYS``: a new end key cannot be left out of the list the reopening clears.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpokit.config.base import ConfigError

from .resume import atomic_write

SUMMARY_FILE = "summary.json"
END_KEYS = ("steps", "eval_after", "interrupted", "stop_signal", "eval_owed", "failed")
EARLIER = "earlier_sessions"


def read_summary(run_dir: Path, resuming: bool) -> dict[str, Any]:
    """A resumed run's summary.json so far ({} for a new run or none yet)."""
    p = run_dir / SUMMARY_FILE
    if not (resuming and p.exists()):
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{str(p)!r} is torn or damaged (not a JSON object); restore it, or remove it to resume with the "
            "summary started afresh"
        )
    return data


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json, replaced whole (a reader never sees half of it)."""
    atomic_write(run_dir / SUMMARY_FILE, json.dumps(summary, indent=2))


def reopen(summary: dict[str, Any]) -> dict[str, Any]:
    """The earlier session's end taken out of ``summary`` (in place) and appended to its ``earlier_sessions``;
    returned ({} when the earlier session left none: it was killed, or the run is new)."""
    ended = {k: summary.pop(k) for k in END_KEYS if k in summary}
    if ended:
        summary[EARLIER] = [*summary.get(EARLIER, []), ended]
    return ended


def end(summary: dict[str, Any], **ended: Any) -> None:
    """Write how this session ended into ``summary`` (in place), replacing every end key it had: only the keys
    of ``END_KEYS`` are accepted."""
    unknown = sorted(set(ended) - set(END_KEYS))
    if unknown:
        raise ValueError(f"{unknown} are not end keys of summary.json; add them to run_summary.END_KEYS")
    for k in END_KEYS:
        summary.pop(k, None)
    summary.update(ended)
