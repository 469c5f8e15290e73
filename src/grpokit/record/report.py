"""The run report: one self-contained, interactive HTML file that shows what one or more runs did.

`write_report(run_dir)` writes RUN_DIR/report.html; `write_comparison(run_dirs, out)` overlays several
runs on the same panels and lists their config differences; `watch(...)` rewrites the file every few
seconds while a run is in progress and the page reloads itself until the run has ended (record/run_status.py).

    doctor.py      -> findings at the top: what looks wrong, the evidence, what to try
    metrics.jsonl  -> one interactive panel per metric group (report_data.panels); hover values,
                      zoom (drag; wheel), pan (shift + wheel), smoothing, log scale
    health.jsonl   -> the live health warnings, with their advice
    samples.jsonl  -> a samples browser: filter by step, reward, finish reason, text; conversations
                      and tool calls as turns; `log_extra` columns; images named by a sample
    summary.json, config.yaml -> verbatim

Offline, years later: the plotting library (uPlot, MIT, in assets/) and the page's own script and
styles are inlined, a Content-Security-Policy forbids every request, and the data travels as JSON in
a script element of type application/json with `<`, `>` and `&` written as \\u escapes, so no text
from a run can end that element. The page's script puts run text into the page with `textContent`
only, and the Python-rendered parts pass through `html.escape`: a model that learned to write
`<script>` cannot run it in the reader's browser. Missing files leave their section out or say so.
"""

from __future__ import annotations

import html
import json
import math
import os
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from .doctor import Diagnosis, examine
from .jsonl import to_json_value
from .report_data import (
    Run,
    columns,
    config_diff,
    heldout,
    load_run,
    metric_names,
    panels,
    same_as,
    samples_payload,
    unique_names,
)
from .run_writer import LOCK_FILE, Heartbeat

REPORT_FILE = "report.html"
# after the step count of a run that has not finished (record/run_status.py's states)
STATE_NOTES = {
    "running": " (in progress)",
    "unknown": " (in progress)",
    "failed": " (stopped by an error)",
    "died": " (died without a record)",
}
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


def _asset(name: str) -> str:
    return resources.files("grpokit.record").joinpath("assets", name).read_text(encoding="utf-8")


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _esc(value)
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _json_for_script(obj: Any) -> str:
    """JSON that cannot close its <script> element nor open a comment, whatever the strings hold."""
    # to_json_value: a NaN reward in a sample becomes the string "NaN" (strict JSON; the page shows it)
    text = json.dumps(to_json_value(obj), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _last_mean(rows: Sequence[dict[str, Any]], key: str, n: int = 10) -> str | None:
    """The mean of `key` over the last `n` steps that logged it, saying how many of them were NaN or inf
    (their mean is not taken around them silently); None when no step logged it."""
    last = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool)][-n:]
    if not last:
        return None
    ok = [v for v in last if math.isfinite(v)]
    bad = len(last) - len(ok)
    if not ok:
        return f"non-finite at the last {len(last)} steps"
    return _fmt(sum(ok) / len(ok)) + (f" ({bad} of the last {len(last)} non-finite)" if bad else "")


def headline_html(run: Run) -> str:
    rows, summary = run.metrics, run.summary
    cards: list[tuple[str, str]] = []
    steps = summary.get("steps", max((r.get("step", 0) for r in rows), default=None))
    if steps is not None:
        cards.append(("steps", _fmt(steps) + STATE_NOTES.get(run.status.state, "")))
    before, after = (
        summary.get(k, {}) if isinstance(summary.get(k), dict) else {} for k in ("eval_before", "eval_after")
    )
    if "accuracy" in before or "accuracy" in after:
        cards.append(("eval accuracy", f"{_fmt(before.get('accuracy', '–'))} → {_fmt(after.get('accuracy', '–'))}"))
    for key in sorted(
        k for k in {**before, **after} if k.startswith("reward_")
    ):  # per question kind (train/evaluate.py)
        cards.append((f"eval reward ({key[7:]})", f"{_fmt(before.get(key, '–'))} → {_fmt(after.get(key, '–'))}"))
    for label, key in (
        ("reward (last 10)", "reward"),
        ("entropy (last 10)", "entropy"),
        ("tokens / s (last 10)", "tokens_per_second"),
    ):
        value = _last_mean(rows, key)
        if value is not None:
            cards.append((label, _esc(value)))
    total = sum(
        float(r["time/step"])
        for r in rows
        if isinstance(r.get("time/step"), (int, float)) and math.isfinite(r["time/step"])
    )
    if total:
        cards.append(("train time", f"{total / 60:.1f} min" if total >= 120 else f"{total:.1f} s"))
    cards.append(("health warnings", str(len(_warnings(run)))))
    return (
        '<div class="cards">'
        + "".join(f'<div class="card"><div class="k">{_esc(k)}</div><div class="v">{v}</div></div>' for k, v in cards)
        + "</div>"
    )


def _warnings(run: Run) -> list[dict[str, Any]]:
    return [e for e in run.events if e.get("level", "warning") != "info"]


def health_html(run: Run) -> str:
    warnings, notes = _warnings(run), [e for e in run.events if e.get("level") == "info"]
    parts = [
        f'<div class="warn"><b>step {_esc(w.get("step", "?"))} · {_esc(w.get("monitor", "note"))}</b> — '
        f"{_esc(w.get('message', ''))}</div>"
        for w in warnings
    ] or ['<div class="ok">No health monitor fired during this run.</div>']
    parts += [
        f'<div class="ok"><b>step {_esc(n.get("step", "?"))} · {_esc(n.get("monitor", "note"))}</b> — '
        f"{_esc(n.get('message', ''))}</div>"
        for n in notes
    ]  # e.g. "converged": information, not a problem
    return "".join(parts)


def doctor_html(diag: Diagnosis, drawn: dict[str, str] | None = None) -> str:
    """The doctor's findings, each linked to the panel (`drawn`: panel id -> title) and the steps of its
    evidence (the page's script zooms every panel to them), then its notes (cost, what was not checked)."""
    drawn = drawn or {}
    parts = [] if diag.findings else ['<div class="ok">The doctor found nothing to fix in this run.</div>']
    for i, f in enumerate(diag.findings, 1):
        link = ""
        if f.panel in drawn:
            steps = f" (steps {f.steps[0]}-{f.steps[1]})" if f.steps else ""
            data = f' data-steps="{f.steps[0]},{f.steps[1]}"' if f.steps else ""
            link = (
                f' <a class="evidence" href="#plot-{_esc(f.panel)}" data-panel="{_esc(f.panel)}"{data}>'
                f"see {_esc(drawn[f.panel])}{_esc(steps)}</a>"
            )
        parts.append(
            f'<div class="finding sev{f.severity}"><b>{i}. {_esc(f.title)}</b> <span class="code">{_esc(f.code)}</span>'
            f'<div>{_esc(f.evidence)}{link}</div><div class="try">try: {_esc(f.advice)}</div></div>'
        )
    if diag.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{_esc(n.text)}</li>" for n in diag.notes) + "</ul>")
    return "".join(parts)


def config_diff_html(runs: Sequence[Run]) -> str:
    diff = config_diff(runs)
    notes = "".join(f'<p class="muted">{_esc(r.name)}: {_esc(r.config_note)}</p>' for r in runs if r.config_note)
    if not diff:
        return notes + '<p class="muted">The runs\' configs do not differ (or have no config.yaml).</p>'
    head = "".join(f"<th>{_esc(r.name)}</th>" for r in runs)
    body = "".join(
        f"<tr><td><code>{_esc(k)}</code></td>" + "".join(f"<td>{_esc(v)}</td>" for v in vals) + "</tr>"
        for k, vals in diff
    )
    return notes + f'<table class="diff"><tr><th>field</th>{head}</tr>{body}</table>'


def payload(runs: Sequence[Run], live_s: float | None = None) -> dict[str, Any]:
    """The JSON the page draws from: panels, each run's columns and samples, live-refresh settings."""
    plots = panels(runs)
    keys = list(dict.fromkeys(k for p in plots for k in p["keys"]))
    for p in plots:
        p["same"] = same_as(runs, p["keys"])
    data = []
    for run in runs:
        steps, cols = columns(run, keys)
        data.append(
            {
                "name": run.name,
                "steps": steps,
                "heldout": heldout(run),
                "series": {k: v for k, v in cols.items() if any(x is not None for x in v)},
                "samples": samples_payload(run),
            }
        )
    live = {"refresh_s": live_s} if live_s and not all(r.status.ended for r in runs) else None
    return {"panels": plots, "runs": data, "live": live}


def _run_section(run: Run, many: bool) -> str:
    prefix = f"{_esc(run.name)}: " if many else ""
    return (
        f"<h2>{prefix}health warnings ({len(_warnings(run))})</h2>"
        + health_html(run)
        + f"<details><summary>{prefix}summary.json</summary>"
        + (
            f'<pre class="box">{_esc(json.dumps(run.summary, indent=2, ensure_ascii=False, default=str))}</pre>'
            if run.summary
            else '<p class="muted">No summary.json (the run may not have finished).</p>'
        )
        + "</details>"
        + f"<details><summary>{prefix}config.yaml (as the run started; --resume's changes: config_history.yaml)"
        + "</summary>"
        + (f'<p class="muted">{_esc(run.config_note)}</p>' if run.config_note else "")
        + (
            f'<pre class="box">{_esc(run.config_text)}</pre>'
            if run.config_text
            else '<p class="muted">No config.yaml.</p>'
        )
        + "</details>"
    )


def _zeros_html(runs: Sequence[Run]) -> str:
    zeros = metric_names(runs)[1]
    return f'<p class="muted zeros">0 at every step (not drawn): {_esc(", ".join(zeros))}</p>' if zeros else ""


def _load(run_dirs: Sequence[Path], heartbeats: dict[Path, Heartbeat] | None = None) -> list[Run]:
    paths = [Path(p) for p in run_dirs]
    return [load_run(p, n, (heartbeats or {}).get(p)) for p, n in zip(paths, unique_names(paths))]


def render(run_dirs: Sequence[Path], live_s: float | None = None) -> str:
    """The report of one run, or the comparison of several, as an HTML string."""
    return render_runs(_load(run_dirs), live_s)


def render_runs(runs: Sequence[Run], live_s: float | None = None) -> str:
    """`render` of runs already read (each judged once: `Run.status`)."""
    paths = [r.path for r in runs]
    many = len(runs) > 1
    title = "grpokit comparison · " + " vs ".join(r.name for r in runs) if many else f"grpokit run · {runs[0].name}"
    sections = [
        f'<h1>{_esc(title)}</h1><p class="sub">{_esc(" · ".join(str(p) for p in paths))} · '
        f"{' + '.join(str(len(r.metrics)) for r in runs)} metric records</p>",
        '<div id="live" class="live" hidden></div>',
    ]
    drawn = {p["id"]: p["title"] for p in panels(runs)}
    for run in runs:
        sections.append((f"<h2>{_esc(run.name)}</h2>" if many else "") + headline_html(run))
        sections.append(f"<h2>Doctor{': ' + _esc(run.name) if many else ''}</h2>" + doctor_html(examine(run), drawn))
    if many:
        sections.append("<h2>Config differences</h2>" + config_diff_html(runs))
    sections.append(
        '<h2>Training curves</h2><div id="controls" class="controls"></div>'
        + (
            '<div id="plots" class="grid"></div>'
            if any(r.metrics for r in runs)
            else '<p class="muted">No metrics.jsonl in this run directory.</p>'
        )
        + _zeros_html(runs)
    )
    sections.append(
        '<h2>Sample completions</h2><div id="samples">'
        + (
            ""
            if any(r.samples for r in runs)
            else '<p class="muted">No samples were logged (samples.jsonl is missing or empty).</p>'
        )
        + "</div>"
    )
    sections += [_run_section(r, many) for r in runs]
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}"><title>{_esc(title)}</title>'
        f'<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<style>{_asset('uPlot.min.css')}\n{_asset('report.css')}</style></head><body><main>{''.join(sections)}</main>"
        f'<script type="application/json" id="grpokit-data">{_json_for_script(payload(runs, live_s))}</script>'
        "<script>/* uPlot 1.6.32, (c) Leon Sorokin, MIT License (assets/uPlot.LICENSE) "
        f"*/\n{_asset('uPlot.iife.min.js')}</script>"
        f"<script>{_asset('report.js')}</script></body></html>\n"
    )


def render_report(run_dir: Path) -> str:
    """The report of `run_dir` as an HTML string (see the module docstring for what goes in)."""
    return render([Path(run_dir)])


def write_report(run_dir: Path) -> Path:
    """Write RUN_DIR/report.html and return its path."""
    return write_comparison(
        [Path(run_dir)], Path(run_dir) / REPORT_FILE
    )  # atomic: `report --watch` may read or write it too


def write_comparison(run_dirs: Sequence[Path], out: Path, live_s: float | None = None) -> Path:
    """Write the report of `run_dirs` (one run, or several overlaid) to `out`, atomically: a page
    reloading while the file is rewritten must never read half of it."""
    return _write(Path(out), render(run_dirs, live_s))


def _write(out: Path, page: str) -> Path:
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")  # one per process: the trainer and `report --watch` may both
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out


def watch(
    run_dirs: Sequence[Path],
    out: Path,
    interval_s: float = 5.0,
    max_updates: int | None = None,
    sleep=time.sleep,
    clock=time.monotonic,
) -> Path:
    """Rewrite `out` every `interval_s` seconds until every run has ended (run_status.py: finished, stopped,
    failed, or died without a record), then once more without the reload; the page reloads itself meanwhile
    (file:// pages cannot fetch the run's files, so the file is what changes). A holder on another host is
    judged by its heartbeat, looked at on every rewrite: dead once its time did not move for STALE_S seconds
    of `clock` (run_writer.Heartbeat), whatever the hosts' clocks say. `max_updates` bounds the loop (tests)."""
    beats = {Path(p): Heartbeat(Path(p) / LOCK_FILE, clock) for p in run_dirs}
    n = 0
    while True:
        runs = _load(run_dirs, beats)
        finished = all(r.status.ended for r in runs)  # judged once per rewrite: the page shows the same verdict
        _write(Path(out), render_runs(runs, None if finished else interval_s))
        n += 1
        if finished or (max_updates is not None and n >= max_updates):
            return out
        sleep(interval_s)


def report_main(run_dir: str | Path) -> int:
    """Entry point of `grpokit report RUN_DIR`: writes the report, prints its path; exit code 0/2."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        print(f"grpokit report: {run_dir} is not a directory (expected a run directory with metrics.jsonl)")
        return 2
    path = write_report(run_dir)
    print(f"report written to {path}")
    return 0
