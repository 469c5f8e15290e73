"""The report shows what the doctor saw: each finding links to the panel and the steps of its evidence,
the notes (cost, what was not checked) follow, and the held-out panel's data starts at the
before-training point. The browser half is in test_report_browser.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from grpokit.record.report import render_report
from helpers.doctor_runs import healthy_rows, sick, write_run


def test_each_finding_links_to_its_panel_and_steps(tmp_path: Path) -> None:
    run = sick(tmp_path, **{"completions/clipped_ratio": 0.4, "grad_norm": lambda s, r: 0.0 if s <= 30 else 1.0})
    html = render_report(run)
    links = re.findall(
        r'<a class="evidence" href="#plot-([\w-]+)" data-panel="[\w-]+" data-steps="(\d+),(\d+)">see ([^<]+)</a>', html
    )
    assert ("grad-norm", "21", "30", "Gradient norm (before clipping) (steps 21-30)") in links
    # completions/clipped_ratio is a fraction of completions, drawn apart from the fractions of groups
    assert ("truncated", "51", "60", "Truncated completions (fraction of completions) (steps 51-60)") in links
    assert '<ul class="notes"><li>1.4 rollouts paid per useful one' in html


def test_a_finding_whose_panel_is_not_drawn_has_no_link(tmp_path: Path) -> None:
    # grad_norm 0 at every step from 21: the panel exists only if some value is non-zero; here none is
    rows = [{k: v for k, v in r.items() if k != "grad_norm"} | {"grad_norm": 0.0} for r in healthy_rows()]
    html = render_report(write_run(tmp_path / "run", rows))
    assert "zero_grad_steps" in html and 'href="#plot-grad-norm"' not in html


def test_the_heldout_points_start_at_the_before_training_score(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", healthy_rows())
    (run / "summary.json").write_text(
        json.dumps({"eval_before": {"accuracy": 0.68}, "eval_after": {"accuracy": 0.87}, "steps": 60})
    )
    html = render_report(run)
    data = json.loads(
        re.search(r'<script type="application/json" id="grpokit-data">(.*?)</script>', html, re.S).group(1)
    )
    assert data["runs"][0]["heldout"] == [[0, 0.68], [60, 0.87]]
