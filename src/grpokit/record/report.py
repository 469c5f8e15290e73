"""The run report: one self-contained HTML file that shows what a training run did.

`write_report(run_dir)` reads what the run left in its directory and writes RUN_DIR/report.html:

    metrics.jsonl  -> plots: reward (total and per function), eval accuracy, KL, entropy, completion
                      length, clip fractions, groups without signal, time per phase, loss, grad norm
    summary.json   -> headline figures (steps, eval accuracy before and after training)
    health.jsonl   -> the health warnings, with their advice
    samples.jsonl  -> sample completions with rewards and advantages
    config.yaml    -> the resolved config, verbatim

The file must open anywhere, years later, offline: plots are inline SVG drawn by `svg.py`, styles are
inline, there is no script and no reference to any URL. Every string that came from the run (model
output above all, but also prompts, reward-function names and config text) is HTML-escaped; a model
that learned to write `<script>` must not be able to run it in the reader's browser.
Anything missing (a run killed before its summary, a run without samples) leaves its section out or
says so; the report never fails because a file is absent.
"""

from __future__ import annotations

import fnmatch
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .jsonl import HEALTH_FILE, METRICS_FILE, SAMPLES_FILE, read_jsonl
from .svg import PALETTE, Series, line_chart

REPORT_FILE = "report.html"

# Which plot shows the evidence of each health monitor: its warnings are marked there.
MONITOR_PLOTS = {
    "entropy_collapse": "entropy", "zero_std_groups": "zero-std", "length_inflation": "length",
    "kl_runaway": "kl", "clip_runaway": "clip", "same_length": "zero-std", "same_text": "zero-std",
    "nonfinite": "loss",
}

# (id, title, metric patterns, y_range, include_zero, note). Patterns may use * (fnmatch).
PLOTS: tuple[tuple[str, str, tuple[str, ...], tuple[float, float] | None, bool, str], ...] = (
    ("reward", "Reward", ("reward", "rewards/*/mean"), None, False, "mean over all completions; per function unweighted"),
    ("eval", "Eval accuracy", ("eval/accuracy",), (0.0, 1.0), False, "rings: summary.json before / after"),
    ("kl", "KL to reference", ("kl",), None, True, "mean per token"),
    ("entropy", "Entropy", ("entropy",), None, True, "nats per completion token"),
    ("length", "Completion length", ("completions/mean_length", "completions/min_length", "completions/max_length"), None, True, "tokens"),
    ("clip", "Clipped tokens", ("clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean"), None, True, "fraction of tokens outside the trust region"),
    ("zero-std", "Groups without signal", ("frac_reward_zero_std", "completions/clipped_ratio", "completions/frac_groups_same_length", "completions/frac_groups_same_text"), (0.0, 1.0), False, "fractions"),
    ("time", "Time per phase", ("time/rollout", "time/reward", "time/update", "time/step"), None, True, "seconds per step"),
    ("loss", "Loss", ("loss",), None, False, ""),
    ("grad-norm", "Gradient norm", ("grad_norm",), None, True, "before clipping"),
)
# Drawn only when the run recorded them (runs with multi-turn episodes, docs/AGENTS.md).
OPTIONAL_PLOTS: tuple[tuple[str, str, tuple[str, ...], tuple[float, float] | None, bool, str], ...] = (
    ("episodes", "Episodes (tools)", ("episodes/turns_mean", "episodes/tool_use_rate", "tools/failure_frequency",
                                      "episodes/truncated_by_turns", "eval/tool_use_rate"), None, True,
     "turns per episode; fractions of episodes / calls"),
    # Faults of untrusted code, contained and counted (docs/FAULTS.md); drawn only when one happened.
    ("faults", "Faults in untrusted code", ("rewards/*/failures", "rewards/*/timeouts", "rewards/*/nonfinite",
                                            "episodes/tool_errors_mean", "episodes/tool_timeouts_mean",
                                            "episodes/reset_failures"), None, True,
     "failed / timed-out reward calls per step; tool errors and time-outs per episode"),
)

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;background:#f4f5f7;color:#1f2937}
main{max-width:1180px;margin:0 auto;padding:20px 24px 40px}
h1{font-size:22px;margin:4px 0 2px}h2{font-size:17px;margin:28px 0 10px;border-bottom:1px solid #d1d5db;padding-bottom:4px}
.sub{color:#6b7280;margin:0 0 14px}.muted{color:#6b7280;fill:#6b7280}
.cards{display:flex;flex-wrap:wrap;gap:10px}.card{flex:1 1 120px;background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:10px 14px}
.card .k{font-size:12px;color:#6b7280;text-transform:uppercase;letter-spacing:.03em}.card .v{font-size:20px;font-weight:600;white-space:nowrap}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:12px}
.plot{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:10px 12px 6px}
.plot h3{font-size:14px;margin:0}.plot .note{font-size:12px;color:#6b7280;margin-left:6px;font-weight:normal}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin:4px 0 2px}.legend i{display:inline-block;width:14px;height:3px;margin-right:5px;vertical-align:middle;border-radius:2px}
svg.chart{width:100%;height:auto;display:block}svg .grid{stroke:#eef0f3;stroke-width:1}svg .frame{fill:none;stroke:#d1d5db}
svg .tick{font-size:11px;fill:#6b7280}svg .mark{stroke:#f59e0b;stroke-width:1.5;stroke-dasharray:4 3}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}th,td{border:1px solid #e5e7eb;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f9fafb;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap;width:1%}th{white-space:nowrap}td.fin{width:1%;white-space:nowrap}
.warn{background:#fffbeb;border:1px solid #fcd34d;border-radius:8px;padding:8px 12px;margin:6px 0}.warn b{color:#92400e}
.ok{background:#ecfdf5;border:1px solid #6ee7b7;border-radius:8px;padding:8px 12px}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre.box{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:10px 12px;max-height:420px;overflow:auto}
details{margin:8px 0}summary{cursor:pointer;font-weight:600}.prompt{background:#eef2ff;border-radius:6px;padding:6px 10px;margin:10px 0 6px}
.pos{color:#047857}.neg{color:#b91c1c}
.turn{border-left:3px solid #6366f1;padding:2px 8px;margin:3px 0}.turn.tool{border-left-color:#f59e0b;background:#fffbeb}
.turn .who{font-size:11px;color:#6b7280;text-transform:uppercase}.call{font:12px ui-monospace,monospace;color:#4338ca;background:#eef2ff;border-radius:4px;padding:1px 6px;display:inline-block}
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _esc(value)
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _metric_names(rows: Sequence[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(k for k in row if k != "step"))
    return list(names)


def _series_for(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> list[Series]:
    out = []
    for i, name in enumerate(names):
        pts = [(float(r["step"]), float(r[name])) for r in rows
               if isinstance(r.get("step"), (int, float)) and isinstance(r.get(name), (int, float))]
        if pts:
            out.append(Series(name, pts, PALETTE[i % len(PALETTE)]))
    return out


def _plot_card(plot_id: str, title: str, series: list[Series], note: str, **chart: Any) -> str:
    legend = "".join(f'<span><i style="background:{_esc(s.color)}"></i>{_esc(s.label)}</span>' for s in series)
    body = line_chart(series, **chart) if series else '<p class="muted">not recorded in this run</p>'
    note_html = f'<span class="note">{_esc(note)}</span>' if note else ""
    return (f'<div class="plot" id="plot-{_esc(plot_id)}"><h3>{_esc(title)}{note_html}</h3>'
            f'<div class="legend">{legend}</div>{body}</div>')


def plots_html(rows: Sequence[dict[str, Any]], summary: dict[str, Any], warnings: Sequence[dict[str, Any]] = ()) -> str:
    """The grid of plot cards, one per entry of PLOTS (a placeholder card where nothing was recorded).

    Health warnings are drawn as dashed vertical lines on the plot that shows their evidence.
    """
    names = _metric_names(rows)
    cards = []
    for plot_id, title, patterns, y_range, include_zero, note in PLOTS + OPTIONAL_PLOTS:
        chosen = [n for p in patterns for n in (fnmatch.filter(names, p) if "*" in p else [p] if p in names else [])]
        series = _series_for(rows, list(dict.fromkeys(chosen)))
        if plot_id == "eval":
            series += _eval_summary_series(summary, rows, len(series))
        if plot_id == "faults":  # counters that stayed 0 say nothing: leave them (and an all-quiet plot) out
            series = [s for s in series if any(v for _, v in s.points)]
        if not series and any(plot_id == p[0] for p in OPTIONAL_PLOTS):
            continue
        marks = [(float(w["step"]), f"step {w['step']}: {w.get('monitor')}") for w in warnings
                 if MONITOR_PLOTS.get(str(w.get("monitor"))) == plot_id and isinstance(w.get("step"), (int, float))]
        if marks:
            note = (note + "; " if note else "") + "dashed: health warnings"
        cards.append(_plot_card(plot_id, title, series, note, y_range=y_range, include_zero=include_zero, marks=marks))
    return '<div class="grid">' + "".join(cards) + "</div>"


def _eval_summary_series(summary: dict[str, Any], rows: Sequence[dict[str, Any]], offset: int) -> list[Series]:
    """Before/after accuracies from summary.json as a two-point series (step 0 and the last step)."""
    last = max((r["step"] for r in rows if isinstance(r.get("step"), (int, float))), default=0)
    steps = summary.get("steps", last) if isinstance(summary.get("steps"), (int, float)) else last
    pts = [(float(x), float(summary[k]["accuracy"])) for k, x in (("eval_before", 0), ("eval_after", steps))
           if isinstance(summary.get(k), dict) and isinstance(summary[k].get("accuracy"), (int, float))]
    return [Series("before / after training", pts, PALETTE[(offset + 3) % len(PALETTE)], dots_only=True)] if pts else []


def _last_mean(rows: Sequence[dict[str, Any]], key: str, n: int = 10) -> float | None:
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return sum(vals[-n:]) / len(vals[-n:]) if vals else None


def headline_html(rows: Sequence[dict[str, Any]], summary: dict[str, Any], warnings: Sequence[dict[str, Any]]) -> str:
    cards: list[tuple[str, str]] = []
    steps = summary.get("steps", max((r.get("step", 0) for r in rows), default=None))
    if steps is not None:
        cards.append(("steps", _fmt(steps)))
    before, after = (summary.get(k, {}) if isinstance(summary.get(k), dict) else {} for k in ("eval_before", "eval_after"))
    if "accuracy" in before or "accuracy" in after:
        cards.append(("eval accuracy", f"{_fmt(before.get('accuracy', '–'))} → {_fmt(after.get('accuracy', '–'))}"))
    for label, key in (("reward (last 10)", "reward"), ("entropy (last 10)", "entropy"), ("tokens / s", "tokens_per_second")):
        value = _last_mean(rows, key)
        if value is not None:
            cards.append((label, _fmt(value)))
    times = [float(r["time/step"]) for r in rows if isinstance(r.get("time/step"), (int, float)) and math.isfinite(r["time/step"])]
    if times:
        total = sum(times)
        cards.append(("train time", f"{total / 60:.1f} min" if total >= 60 else f"{total:.1f} s"))
    cards.append(("health warnings", str(len(warnings))))
    return '<div class="cards">' + "".join(f'<div class="card"><div class="k">{_esc(k)}</div><div class="v">{v}</div></div>' for k, v in cards) + "</div>"


def health_html(warnings: Sequence[dict[str, Any]]) -> str:
    if not warnings:
        return '<div class="ok">No health monitor fired during this run.</div>'
    return "".join(f'<div class="warn"><b>step {_esc(w.get("step", "?"))} · {_esc(w.get("monitor", "note"))}</b> — {_esc(w.get("message", ""))}</div>'
                   for w in warnings)


def samples_html(samples: Sequence[dict[str, Any]], max_steps: int = 3, max_chars: int = 3000) -> str:
    """Sample completions of (up to) the first, a middle and the last sampled step; the last one open."""
    if not samples:
        return '<p class="muted">No samples were logged (samples.jsonl is missing or empty).</p>'
    steps = sorted({s.get("step") for s in samples if isinstance(s.get("step"), (int, float))})
    if len(steps) > max_steps:
        steps = [steps[0], steps[len(steps) // 2], steps[-1]][:max_steps]
    out = []
    for i, step in enumerate(steps):
        rows = [s for s in samples if s.get("step") == step]
        inner = []
        for row in rows:
            comps = row.get("completions") or []
            funcs = list(dict.fromkeys(k for c in comps for k in (c.get("rewards") or {})))
            head = "".join(f"<th>{_esc(f)}</th>" for f in funcs)
            body = []
            for j, c in enumerate(comps):
                adv = c.get("advantage")
                cls = "pos" if isinstance(adv, (int, float)) and adv > 0 else "neg" if isinstance(adv, (int, float)) and adv < 0 else ""
                text = str(c.get("text", ""))
                if len(text) > max_chars:
                    text = text[:max_chars] + f"\n… [{len(text) - max_chars} more characters]"
                per = "".join(f'<td class="num">{_fmt((c.get("rewards") or {}).get(f, ""))}</td>' for f in funcs)
                body.append(f'<tr><td class="num">{j}</td><td class="num">{_fmt(c.get("reward", ""))}</td>{per}'
                            f'<td class="num {cls}">{_fmt(adv if adv is not None else "")}</td><td class="num">{_fmt(c.get("length", ""))}</td>'
                            f'<td class="fin">{_esc(c.get("finish_reason", ""))}</td><td>{_completion_cell(c, text, max_chars)}</td></tr>')
            inner.append(f'<div class="prompt"><pre>{_esc(row.get("prompt", ""))}</pre></div>'
                         f'<table><tr><th>#</th><th>reward</th>{head}<th>advantage</th><th>length</th><th>finish</th><th>completion</th></tr>{"".join(body)}</table>')
        is_open = " open" if i == len(steps) - 1 else ""
        out.append(f'<details{is_open}><summary>step {_esc(step)} — {len(rows)} prompt(s)</summary>{"".join(inner)}</details>')
    return "".join(out)


def _completion_cell(c: dict[str, Any], text: str, max_chars: int) -> str:
    """A completion: its text, or for a multi-turn episode its conversation turn by turn, with the
    model's turns, its tool calls and the environment's replies drawn distinctly."""
    messages = c.get("messages")
    if not isinstance(messages, list) or not messages:
        return f"<pre>{_esc(text)}</pre>"
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = str(m.get("content", ""))[:max_chars]
        if m.get("role") == "tool":
            parts.append(f'<div class="turn tool"><span class="who">tool {_esc(m.get("name", ""))} &rarr;</span><pre>{_esc(content)}</pre></div>')
            continue
        calls = "".join(f'<div class="call">call {_esc((t.get("function") or {}).get("name", ""))}'
                        f'({_esc(json.dumps((t.get("function") or {}).get("arguments", ""), ensure_ascii=False))})</div>'
                        for t in m.get("tool_calls") or [] if isinstance(t, dict))
        parts.append(f'<div class="turn model"><span class="who">model</span><pre>{_esc(content)}</pre>{calls}</div>')
    return "".join(parts)


def summary_html(summary: dict[str, Any]) -> str:
    if not summary:
        return '<p class="muted">No summary.json (the run may not have finished).</p>'
    return f'<pre class="box">{_esc(json.dumps(summary, indent=2, ensure_ascii=False, default=str))}</pre>'


def render_report(run_dir: Path) -> str:
    """The report of `run_dir` as an HTML string (see the module docstring for what goes in)."""
    run_dir = Path(run_dir)
    rows = read_jsonl(run_dir / METRICS_FILE)
    samples = read_jsonl(run_dir / SAMPLES_FILE)
    events = read_jsonl(run_dir / HEALTH_FILE)
    warnings = [e for e in events if e.get("level", "warning") != "info"]
    notes = [e for e in events if e.get("level") == "info"]  # e.g. "converged": information, not a problem
    summary = _read_json(run_dir / "summary.json")
    config_path = run_dir / "config.yaml"
    config_text = config_path.read_text(encoding="utf-8", errors="replace") if config_path.exists() else ""
    title = f"grpokit run · {run_dir.resolve().name}"
    sections = [
        f"<h1>{_esc(title)}</h1><p class=\"sub\">{_esc(str(run_dir))} · {len(rows)} metric records</p>",
        headline_html(rows, summary, warnings),
        "<h2>Training curves</h2>" + (plots_html(rows, summary, warnings) if rows or summary else '<p class="muted">No metrics.jsonl in this run directory.</p>'),
        f"<h2>Health warnings ({len(warnings)})</h2>" + health_html(warnings)
        + "".join(f'<div class="ok"><b>step {_esc(n.get("step", "?"))} · {_esc(n.get("monitor", "note"))}</b> — '
                  f'{_esc(n.get("message", ""))}</div>' for n in notes),
        "<h2>Sample completions</h2>" + samples_html(samples),
        "<h2>Summary</h2>" + summary_html(summary),
        "<h2>Config</h2>" + (f'<pre class="box">{_esc(config_text)}</pre>' if config_text else '<p class="muted">No config.yaml.</p>'),
    ]
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{CSS}</style></head>'
            f'<body><main>{"".join(sections)}</main></body></html>\n')


def write_report(run_dir: Path) -> Path:
    """Write RUN_DIR/report.html and return its path."""
    path = Path(run_dir) / REPORT_FILE
    path.write_text(render_report(Path(run_dir)), encoding="utf-8")
    return path


def report_main(run_dir: str | Path) -> int:
    """Entry point of `grpokit report RUN_DIR`: writes the report, prints its path; exit code 0/2."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        print(f"grpokit report: {run_dir} is not a directory (expected a run directory with metrics.jsonl)")
        return 2
    path = write_report(run_dir)
    print(f"report written to {path}")
    return 0
