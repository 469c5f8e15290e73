"""The report in a real browser (Debian's chromium, headless, driven over the DevTools protocol on
127.0.0.1): it loads offline without console errors or requests, the panels draw, hover shows the
value under the cursor, drag zooms every panel, log scale and smoothing redraw, the samples browser
filters, and a comparison overlays two runs. scripts/install_test_deps.sh installs chromium; without
it (or without websocket-client) these tests are skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpokit.record.report import write_comparison, write_report
from helpers.cdp import CHROMIUM, Browser
from helpers.report_runs import HOSTILE, make_run_dir

pytest.importorskip("websocket")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary installed (scripts/install_test_deps.sh)"),
    pytest.mark.timeout(180),
]

# Non-transparent pixels on each panel's canvas: an empty canvas has none.
INKED = """grpokitReport.plots().map(function (p) {
  var c = p.u.ctx, d = c.getImageData(0, 0, c.canvas.width, c.canvas.height).data, n = 0;
  for (var i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return [p.id, n]; })"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def _over_rect(browser: Browser, i: int) -> dict:
    return browser.js(f"""(function () {{ var o = grpokitReport.plots()[{i}].u.over;
        o.scrollIntoView({{block: "center"}});
        var r = o.getBoundingClientRect(); return {{x: r.left, y: r.top, w: r.width, h: r.height}}; }})()""")


def test_report_loads_offline_draws_and_hovers(browser: Browser, tmp_path: Path) -> None:
    browser.open(write_report(make_run_dir(tmp_path / "run")).as_uri())
    assert browser.errors() == []
    assert all(u.startswith(("file:", "data:")) for u in browser.requests()), browser.requests()
    inked = dict(browser.js(INKED))
    assert (
        "reward" in inked
        and "kl" in inked
        and "mytask" in [p["title"] for p in browser.js("grpokitReport.data.panels")]
    )
    assert all(n > 500 for n in inked.values()), inked  # every panel drew its lines and axes
    eval_labels = browser.js(
        "Array.from(document.querySelectorAll('#plot-eval .u-legend .u-label'))"
        ".map(function (e) { return e.textContent; })"
    )
    assert eval_labels[1:] == ["eval/accuracy", "held-out accuracy before / after (summary.json)"]
    # Hover the middle of the reward panel: the legend shows the step and that step's reward.
    r = _over_rect(browser, 0)
    browser.mouse("mouseMoved", r["x"] + r["w"] / 2, r["y"] + r["h"] / 2)
    shown = browser.js("""(function () { var u = grpokitReport.plots()[0].u, i = u.cursor.idx;
        var cells = document.querySelectorAll('#plot-reward .u-legend .u-value');
        return {idx: i, step: u.data[0][i], value: u.data[1][i],
                text: [cells[0].textContent, cells[1].textContent]}; })()""")
    assert shown["idx"] is not None and shown["text"][0] == str(shown["step"])
    assert float(shown["text"][1]) == pytest.approx(shown["value"], rel=1e-3) and 40 < shown["step"] < 80
    # every other panel's cursor sits on the same step (synced hover)
    others = browser.js("""grpokitReport.plots().slice(1).map(function (p) { var u = p.u, i = u.cursor.idx;
        return i === null || i === undefined ? null : u.data[0][i]; })""")
    assert others and all(s == shown["step"] for s in others), others
    # Hostile model output is on the page as text, and no dialog opened.
    assert browser.js(f"document.body.textContent.indexOf({HOSTILE!r}) >= 0") and browser.errors() == []


def test_zoom_log_scale_smoothing_and_sample_filters(browser: Browser, tmp_path: Path) -> None:
    browser.open(write_report(make_run_dir(tmp_path / "run")).as_uri())
    r = _over_rect(browser, 0)
    y = r["y"] + r["h"] / 2  # drag across the middle fifth of the reward panel
    browser.mouse("mousePressed", r["x"] + 0.4 * r["w"], y, button="left", clickCount=1)
    browser.mouse("mouseMoved", r["x"] + 0.6 * r["w"], y, button="left")
    browser.mouse("mouseReleased", r["x"] + 0.6 * r["w"], y, button="left", clickCount=1)
    ranges = browser.js("grpokitReport.plots().map(function (p) { return [p.u.scales.x.min, p.u.scales.x.max]; })")
    assert ranges[0][1] - ranges[0][0] < 40 and all(
        rg == pytest.approx(ranges[0]) for rg in ranges
    )  # all panels follow
    # Wheel up zooms in around the cursor (x 0.8); shift + wheel pans by a tenth of the range.
    before = ranges[0]
    browser.mouse("mouseWheel", r["x"] + r["w"] / 2, y, deltaX=0, deltaY=-100)
    zoomed = browser.js("[grpokitReport.plots()[1].u.scales.x.min, grpokitReport.plots()[1].u.scales.x.max]")
    assert zoomed[1] - zoomed[0] == pytest.approx(0.8 * (before[1] - before[0]))
    browser.mouse("mouseWheel", r["x"] + r["w"] / 2, y, deltaX=0, deltaY=100, modifiers=8)  # 8: shift
    panned = browser.js("[grpokitReport.plots()[1].u.scales.x.min, grpokitReport.plots()[1].u.scales.x.max]")
    assert panned == pytest.approx(
        [zoomed[0] + 0.1 * (zoomed[1] - zoomed[0]), zoomed[1] + 0.1 * (zoomed[1] - zoomed[0])]
    )
    browser.js("(function () { var c = document.getElementById('logscale'); c.click(); })()")
    distr = dict(browser.js("grpokitReport.plots().map(function (p) { return [p.id, p.u.scales.y.distr]; })"))
    assert distr["kl"] == 3 and distr["loss"] == 4  # KL > 0: log10; the loss changes sign: asinh
    raw = browser.js("grpokitReport.plots()[0].u.data[1].slice(0, 5)")
    browser.js(
        "(function () { var s = document.getElementById('smoothing'); s.value = '0.9';"
        " s.dispatchEvent(new Event('change')); })()"
    )
    smoothed = browser.js("grpokitReport.plots()[0].u.data[1].slice(0, 5)")
    assert smoothed[0] == pytest.approx(raw[0]) and smoothed[1] == pytest.approx(
        (0.9 * 0.1 * raw[0] + 0.1 * raw[1]) / (1 - 0.81)
    )
    # Samples: the last sampled step is shown first; filtering on finish "length" leaves the one truncated answer.
    assert browser.js("document.getElementById('s-step').value") == "120"
    n = browser.js("""(function () { var f = document.getElementById('s-finish'); f.value = 'length';
        f.dispatchEvent(new Event('change'));
        return document.querySelectorAll('#samples table tr').length; })()""")
    assert n == 2  # header + one completion
    assert (
        browser.js("document.querySelectorAll('#samples .turn.tool').length") == 0
    )  # the tool turn was in another group
    browser.js(
        "(function () { var f = document.getElementById('s-finish'); f.value = '';"
        " f.dispatchEvent(new Event('change')); })()"
    )
    assert browser.js("document.querySelectorAll('#samples .turn.tool').length") == 1  # step 120's one episode
    assert (
        browser.js("document.querySelectorAll('#samples img.sample-img').length") == 1
    )  # images/draw.png; ../outside.png is not the run's
    assert browser.errors() == []


def test_comparison_overlays_two_runs(browser: Browser, tmp_path: Path) -> None:
    a, b = make_run_dir(tmp_path / "a", steps=30), make_run_dir(tmp_path / "b", steps=40, lr=3e-6)
    browser.open(write_comparison([a, b], tmp_path / "cmp.html").as_uri())
    assert browser.errors() == []
    labels = browser.js(
        "Array.from(document.querySelectorAll('#plot-entropy .u-legend .u-label'))"
        ".map(function (e) { return e.textContent; })"
    )
    assert labels[1:] == ["a · entropy", "b · entropy"]
    xs = browser.js("grpokitReport.plots()[0].u.data[0]")
    assert xs[0] == 1 and xs[-1] == 40  # the union of both runs' steps
    assert dict(browser.js(INKED))["entropy"] > 500


def test_live_page_reloads_and_keeps_the_readers_settings(browser: Browser, tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", steps=12, finished=False)
    page = write_comparison([run], tmp_path / "live.html", live_s=1)
    browser.open(page.as_uri())
    assert "reloads every 1 s" in browser.js("document.getElementById('live').textContent")
    browser.js(
        "(function () { var s = document.getElementById('smoothing'); s.value = '0.5';"
        " s.dispatchEvent(new Event('change')); })()"
    )
    browser.events.clear()
    browser.wait_event("Page.loadEventFired", timeout=30)  # the page reloaded itself
    assert browser.js("document.getElementById('smoothing').value") == "0.5" and browser.errors() == []
    # Zoomed to 3 steps, the step axis still ticks at whole steps only (uPlot alone would add 3.5, 4.5 ...).
    ticks = browser.js("""new Promise(function (done) { var u = grpokitReport.plots()[0].u;
        u.setScale('x', {min: 3, max: 6});
        setTimeout(function () { done(u.axes[0]._splits); }, 100); })""")  # uPlot redraws after the current task
    assert ticks and all(float(x).is_integer() for x in ticks), ticks


def test_a_zoom_stays_with_its_own_report_file(browser: Browser, tmp_path: Path) -> None:
    # a live page keeps the reader's zoom over its reloads; keyed by the title alone, that zoom was
    # restored in every other report of a run so named, which then drew steps 3-6 of 12 unasked
    live = write_comparison(
        [make_run_dir(tmp_path / "a" / "run", steps=12, finished=False)], tmp_path / "live.html", live_s=1
    )
    other = write_report(make_run_dir(tmp_path / "b" / "run", steps=12))
    span = "grpokitReport.plots().map(function (p) { return [p.u.scales.x.min, p.u.scales.x.max]; })"
    browser.open(other.as_uri())
    full, title = browser.js(span), browser.js("document.title")
    browser.open(live.as_uri())
    assert browser.js("document.title") == title  # one run name, one title
    browser.js("grpokitReport.plots()[0].u.setScale('x', {min: 3, max: 6})")
    browser.events.clear()
    browser.wait_event("Page.loadEventFired", timeout=30)  # the page saved its settings and reloaded itself
    browser.open(live.as_uri())
    assert all(s == [3, 6] for s in browser.js(span))  # kept for this page
    browser.open(other.as_uri())
    assert browser.js(span) == full  # and for this page only


def _set(browser: Browser, id_: str, value: str) -> None:
    browser.js(f"""(function () {{ var f = document.getElementById({id_!r}); f.value = {value!r};
        f.dispatchEvent(new Event('change')); }})()""")


def test_samples_browser_filters_by_step_and_reward_and_shows_extras_and_turns(
    browser: Browser, tmp_path: Path
) -> None:
    browser.open(write_report(make_run_dir(tmp_path / "run")).as_uri())
    metas = (
        "Array.from(document.querySelectorAll('#samples .prompt .meta')).map(function (e) { return e.textContent; })"
    )
    _set(browser, "s-step", "40")  # samples at steps 40, 80, 120: two prompts of two completions each
    assert browser.js(metas) == ["step 40 · 2 of 2 completions"] * 2
    # reward >= 1 keeps the two completions rewarded 2 (one per prompt), rewards [2, 0, 0, 2]
    _set(browser, "s-rmin", "1")
    assert browser.js(metas) == ["step 40 · 1 of 2 completions"] * 2
    cells = browser.js("""Array.from(document.querySelectorAll('#samples table')).map(function (t) {
        var rows = t.querySelectorAll('tr');
        var head = Array.from(rows[0].children).map(function (c) { return c.textContent; });
        return [head, Array.from(rows[1].children).map(function (c) { return c.textContent; })]; })""")
    head, first = cells[0]
    # columns: #, reward, per-function rewards, advantage, length, finish, log_extra columns, completion
    assert head == [
        "#",
        "reward",
        "math",
        "format",
        "advantage",
        "length",
        "finish",
        "judge_note",
        "score_raw",
        "completion",
    ]
    assert (
        first[:8] == ["0", "2", "1", "1", "1", "14", "stop", "<i>fine</i>"] and first[8] == "0.75"
    )  # markup shown as text
    # its conversation, turn by turn: the model's turn with its tool call, then the tool's reply
    turns = browser.js("""Array.from(document.querySelectorAll('#samples table')[0].querySelectorAll('.turn'))
        .map(function (t) { return [t.className, t.querySelector('.who').textContent,
                                    (t.querySelector('.call') || {}).textContent || '']; })""")
    assert turns == [["turn model", "model", 'call calc({"expr":"2+3"})'], ["turn tool", "tool calc →", ""]]
    _set(browser, "s-rmin", "3")
    assert browser.js(metas) == [] and "0 prompt(s) match" in browser.js(
        "document.querySelector('#samples .hint').textContent"
    )
    assert browser.errors() == []


def test_identical_series_both_stay_visible(browser: Browser, tmp_path: Path) -> None:
    """The total reward and its only reward function are the same numbers: the second is drawn dashed on
    top, labelled "(= reward)", and pixels of both colors are on the canvas (gaps of the dash show the first)."""
    from grpokit.record import make_recorder

    rec = make_recorder(tmp_path, ["jsonl"], total_steps=40)
    for step in range(1, 41):
        r = step / 40
        rec.log({"reward": r, "rewards/only/mean": r}, step)
    rec.close()
    browser.open(write_report(tmp_path).as_uri())
    series = browser.js("""grpokitReport.plots()[0].u.series.slice(1).map(function (s) {
        return [s.label, s.dash || [], s._stroke || s.stroke]; })""")
    assert (
        [s[0] for s in series] == ["reward", "rewards/only/mean (= reward)"]
        and series[0][1] == []
        and series[1][1] == [7, 5]
    )
    colors = browser.js("""(function () { var u = grpokitReport.plots()[0].u, c = u.ctx,
        d = c.getImageData(0, 0, c.canvas.width, c.canvas.height).data, seen = {};
        for (var i = 0; i < d.length; i += 4) if (d[i + 3] === 255) {
            var k = [d[i], d[i + 1], d[i + 2]].join(','); seen[k] = (seen[k] || 0) + 1; }
        return seen; })()""")

    def rgb(css: str) -> str:
        h = css.lstrip("#")
        return ",".join(str(int(h[i : i + 2], 16)) for i in (0, 2, 4))

    assert colors.get(rgb(series[0][2]), 0) > 20 and colors.get(rgb(series[1][2]), 0) > 20, (
        series,
        sorted(colors.items(), key=lambda kv: -kv[1])[:6],
    )
    assert browser.errors() == []


def _doctor_run(tmp_path: Path) -> Path:
    """A 60-step run with zero gradients at steps 21-30, a learning rate of 5.4e-6 and held-out accuracy
    0.68 before training (step 0), 0.76 -> 0.87 at its periodic evaluations."""
    import json

    from helpers.doctor_runs import healthy_rows, write_run

    rows = []
    for r in healthy_rows():
        r |= {"learning_rate": 5.4e-6 - 1e-8 * r["step"], "grad_norm": 0.0 if 21 <= r["step"] <= 30 else r["grad_norm"]}
        r |= {"eval/accuracy": 0.76 + 0.11 * (r["step"] - 10) / 50} if "eval/accuracy" in r else {}
        rows.append(r)
    run = write_run(tmp_path / "run", rows)
    (run / "summary.json").write_text(
        json.dumps({"eval_before": {"accuracy": 0.68}, "eval_after": {"accuracy": 0.87}, "steps": 60})
    )
    return run


def test_heldout_panel_draws_the_before_training_point(browser: Browser, tmp_path: Path) -> None:
    browser.open(write_report(_doctor_run(tmp_path)).as_uri())
    assert browser.errors() == []
    box = browser.js("""(function () {
        var p = grpokitReport.plots().filter(function (p) { return p.id === "eval"; })[0].u;
        return {xmin: p.scales.x.min, xmax: p.scales.x.max, ymin: p.scales.y.min, ymax: p.scales.y.max,
                x: p.valToPos(0, "x"), y: p.valToPos(0.68, "y"), w: p.bbox.width / devicePixelRatio,
                h: p.bbox.height / devicePixelRatio}; })()""")
    assert box["xmin"] <= 0 and box["xmax"] >= 60 and box["ymin"] <= 0.68 <= box["ymax"], box
    assert 0 <= box["x"] <= box["w"] and 0 <= box["y"] <= box["h"], box  # the 0.68 of step 0 is on the chart
    # every panel spans the same steps, from 0 (not only the one with a point there)
    spans = browser.js("grpokitReport.plots().map(function (p) { return [p.u.scales.x.min, p.u.scales.x.max]; })")
    assert all(s == spans[0] for s in spans), spans


def test_tick_labels_fit_their_axis(browser: Browser, tmp_path: Path) -> None:
    browser.open(write_report(_doctor_run(tmp_path)).as_uri())
    fit = browser.js("""grpokitReport.plots().map(function (p) { var u = p.u, a = u.axes[1], vs = a._values || [];
        u.ctx.font = a.font[0];
        var w = Math.max.apply(null, vs.map(function (t) {
            return u.ctx.measureText(String(t)).width / devicePixelRatio; }));
        return [p.id, a._size, w, vs]; })""")
    lr = [f for f in fit if f[0] == "lr"][0]
    assert any(str(v).startswith("5.") and "e-6" in str(v) for v in lr[3]), lr  # the whole label, not ".400e-6"
    assert not any(str(v).endswith("0e-6") or "00e" in str(v) for v in lr[3]), lr
    # the axis holds its widest label beside its ticks (uPlot: 10 px ticks, a 5 px gap; 64 px cut 5.400e-6)
    assert all(size >= width + 15 for _, size, width, _ in fit), fit


def test_a_finding_link_zooms_to_its_steps(browser: Browser, tmp_path: Path) -> None:
    browser.open(write_report(_doctor_run(tmp_path)).as_uri())
    link = browser.js("""(function () { var a = document.querySelector('a.evidence[data-panel="grad-norm"]');
        a.scrollIntoView({block: "center"}); var r = a.getBoundingClientRect();
        return {x: r.left + r.width / 2, y: r.top + r.height / 2, steps: a.getAttribute("data-steps")}; })()""")
    assert link["steps"] == "21,30"
    browser.mouse("mousePressed", link["x"], link["y"], button="left", clickCount=1)
    browser.mouse("mouseReleased", link["x"], link["y"], button="left", clickCount=1)
    spans = browser.js("grpokitReport.plots().map(function (p) { return [p.id, p.u.scales.x.min, p.u.scales.x.max]; })")
    assert all(lo == 20 and hi == 31 for _, lo, hi in spans), spans  # steps 21-30, padded by 1
    seen = browser.js("""(function () { var r = document.getElementById("plot-grad-norm").getBoundingClientRect();
        return r.top >= 0 && r.bottom <= window.innerHeight; })()""")
    assert seen and browser.errors() == []
