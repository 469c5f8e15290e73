"""Config fields that were folded into another: an old spelling gets one sentence naming the new one, or,
where the field kept its meaning under a wider name, is read as the new one.

``algo.supervision`` (process), ``algo.credit`` (gigpo, gagpo) and ``algo.entropy_shaping`` (gtpo,
grpo_s) each chose an advantage estimator beside ``algo.advantage``; now ``algo.advantage`` alone
chooses it. Their neutral values (outcome, none), which every config.yaml saved by earlier versions
carries, change nothing and are accepted, so those run folders still resume.

``algo.dynamic_sampling_on`` named the reward functions dynamic sampling judged a group by; the frontier
curriculum and EDGE-GRPO's error correction now read the same judge, ``reward.judge``. The old spelling
(config files, overrides, config.yaml of earlier runs) sets ``reward.judge`` (SPELLINGS). One layer of settings (a
file, one command line) giving both spellings is refused (io.py one_spelling). The config notes that the old
spelling set the field (``note_spelling``, read by ``spelled_as``), so that a run whose old judge now reaches the
curriculum or error correction too is told so once (config/judge.py respelled_judge).
"""

from __future__ import annotations

import copy
from typing import Any

# retired field -> its neutral values (accepted and ignored)
RETIRED: dict[str, tuple[str, ...]] = {
    "algo.supervision": ("outcome",),
    "algo.credit": ("outcome",),
    "algo.entropy_shaping": ("none",),
}


# another spelling -> the field it sets (accepted as that field, not deprecated)
SPELLINGS: dict[str, str] = {"algo.dynamic_sampling_on": "reward.judge"}


def retired_field(dotted: str, value: Any) -> str | None:
    """The sentence refusing ``dotted=value`` when ``dotted`` is a retired field set to choose
    something; "" when it is retired but neutral (nothing to do); None when it is not retired."""
    if dotted not in RETIRED:
        return None
    if str(value) in RETIRED[dotted]:
        return ""
    return (
        f"{dotted}={value!r} is no longer a field: algo.advantage alone chooses the advantage estimator; "
        f"write algo.advantage={value} instead (docs/VARIANTS.md)"
    )


def note_spelling(section: Any, field: str, spelled: str) -> None:
    """Note on ``section`` that ``field`` was set under ``spelled``, another spelling of it (SPELLINGS), with the
    value it now holds; set under its own name, the note goes. Kept beside the fields, never saved (to_dict reads
    fields only)."""
    notes = vars(section).get("_spellings")
    if spelled in SPELLINGS:
        notes = vars(section).setdefault("_spellings", {})
        notes[field] = (spelled, copy.deepcopy(getattr(section, field)))
    elif notes:
        notes.pop(field, None)


def spelled_as(cfg: Any, dotted: str) -> str | None:
    """The other spelling (SPELLINGS) that set ``dotted`` (``section.field``) to the value it holds; None when its own
    name set it, or when the value was changed since (``cfg.reward.judge = ...`` in Python)."""
    section, field = dotted.split(".")
    obj = getattr(cfg, section)
    spelled, value = (vars(obj).get("_spellings") or {}).get(field, (None, None))
    return spelled if spelled is not None and getattr(obj, field) == value else None
