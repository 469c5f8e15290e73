"""The report's panels per domain (data.domains, docs/DOMAINS.md), in record/report_data.py's ``panels``
format: placed before its one-panel-per-namespace fallback, so a run with domains gets, per domain,
its reward and accuracy (training and held-out) and its groups without signal, instead of one panel of
every domain's metrics per namespace. Kept apart from domain_checks.py (which reads a ``Run``) so that
report_data.py can import it without a cycle.
"""

from __future__ import annotations

import fnmatch
from typing import Any


def domain_names(names: list[str] | set[str]) -> list[str]:
    """The domains a run logged (from its ``domain/<d>/reward`` or ``eval/domain/<d>/accuracy`` names)."""
    found = [n.split("/")[1] for n in names if fnmatch.fnmatch(n, "domain/*/reward")]
    found += [n.split("/")[2] for n in names if fnmatch.fnmatch(n, "eval/domain/*/accuracy")]
    return list(dict.fromkeys(found))


def domain_panels(names: list[str]) -> list[dict[str, Any]]:
    """Per domain: its reward and accuracy (training and held-out), and its groups without signal."""
    out = []
    for i, d in enumerate(domain_names(names)):
        pick = [
            (
                f"Domain {d}: reward and accuracy",
                (f"domain/{d}/reward", f"domain/{d}/accuracy", f"eval/domain/{d}/accuracy", f"rewards/{d}/*/mean"),
            ),
            (f"Domain {d}: groups without signal (fractions)", (f"domain/{d}/zero_std", f"domain/{d}/curriculum/*")),
        ]
        for j, (title, patterns) in enumerate(pick):
            keys = list(dict.fromkeys(n for p in patterns for n in fnmatch.filter(names, p)))
            if keys:
                out.append({"id": f"domain-{i}-{j}", "title": title, "keys": keys})
    return out
