"""Write the generated part of docs/TRL.md (the TRL argument -> grpokit field table) from the mapping.

    PYTHONPATH=src python scripts/make_trl_docs.py        # rewrites the table between the markers

tests/trl/test_trl_mapping.py fails when the committed table differs from what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpokit.trl.mapping import mapping_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "TRL.md"
BEGIN = "<!-- BEGIN GENERATED: scripts/make_trl_docs.py -->"
END = "<!-- END GENERATED -->"


def render(text: str) -> str:
    """``text`` with the part between the markers replaced by the current table."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{mapping_table()}{END}{tail}"


if __name__ == "__main__":
    DOC.write_text(render(DOC.read_text()))
    print(f"wrote {DOC}", file=sys.stderr)
