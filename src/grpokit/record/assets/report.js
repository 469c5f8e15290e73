/* grpokit report: draws the panels (uPlot) and the samples browser from the JSON in #grpokit-data.
   Run text only ever reaches the page through textContent, never innerHTML. */
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("grpokit-data").textContent);
  var PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563", "#65a30d", "#9333ea"];
  var DASHES = [[], [8, 4], [2, 3], [10, 3, 2, 3]];
  var INT_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];
  // the reader's settings (zoom, smoothing, scroll) outlive a live page's reload, and belong to this file only:
  // keyed by the title alone, a zoom made in one report was restored in every other report of a run so named
  var STATE_KEY = "grpokit-report:" + location.pathname + ":" + document.title;
  var state = loadState();
  var plots = [];
  var syncing = false;

  function loadState() {
    try { return JSON.parse(sessionStorage.getItem(STATE_KEY)) || {}; } catch (e) { return {}; }
  }
  function saveState() {
    state.scrollY = window.scrollY;
    try { sessionStorage.setItem(STATE_KEY, JSON.stringify(state)); } catch (e) { /* storage off: forget */ }
  }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "--";
    if (typeof v !== "number") return String(v);
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
    return String(+v.toPrecision(4));
  }
  /* Tick labels: fmt without the trailing zeros of an exponent's mantissa (5.400e-6 -> 5.4e-6). */
  function tickFmt(v) {
    return fmt(v).replace(/\.?0+e/, "e");
  }
  /* The y axis as wide as its longest tick label (a fixed width cut 5.400e-6 to .400e-6). */
  function axisSize(u, values) {
    if (!values || !values.length) return 40;
    u.ctx.font = u.axes[1].font[0];
    var widest = Math.max.apply(null, values.map(function (t) { return u.ctx.measureText(String(t)).width; }));
    return Math.ceil(widest / (window.devicePixelRatio || 1)) + 24;  // + tick and gap
  }

  /* TensorBoard's smoothing: a debiased exponential moving average over the finite points. */
  function smooth(vals, w) {
    var out = [], last = 0, n = 0;
    for (var i = 0; i < vals.length; i++) {
      var v = vals[i];
      if (v === null || v === undefined) { out.push(v); continue; }
      last = last * w + (1 - w) * v; n++;
      out.push(last / (1 - Math.pow(w, n)));
    }
    return out;
  }

  /* One panel's series over the union of the runs' steps: [{label, run, key, vals}] and xs. */
  function panelData(panel) {
    var runs = DATA.runs, steps = {}, lists = [];
    runs.forEach(function (run, ri) {
      panel.keys.forEach(function (key, ki) {
        if (!run.series[key]) return;
        run.steps.forEach(function (s) { steps[s] = 1; });
        lists.push({ run: ri, key: key, ki: ki, byStep: run.steps.reduce(function (m, s, i) { m[s] = run.series[key][i]; return m; }, {}) });
      });
    });
    if (panel.id === "eval") runs.forEach(function (run, ri) {  // summary.json: accuracy before / after training
      if (!run.heldout || !run.heldout.length) return;
      var byStep = {};
      run.heldout.forEach(function (p) { steps[p[0]] = 1; byStep[p[0]] = p[1]; });
      lists.push({ run: ri, key: "held-out accuracy before / after (summary.json)", ki: panel.keys.length, byStep: byStep, dots: true });
    });
    var xs = Object.keys(steps).map(Number).sort(function (a, b) { return a - b; });
    lists.forEach(function (l) {
      l.vals = xs.map(function (s) { return l.byStep[s] === undefined ? null : l.byStep[s]; });
      l.count = l.vals.filter(function (v) { return v !== null; }).length;
    });
    return { xs: xs, series: lists };
  }

  function seriesOpts(panel, s, many) {
    var one = panel.keys.length === 1;
    var label = (many ? DATA.runs[s.run].name + " · " : "") + s.key;
    var same = panel.same && panel.same[s.key];
    var color = PALETTE[(many && one ? s.run : s.ki + (many ? s.run * panel.keys.length : 0)) % PALETTE.length];
    var dash = many && !one ? DASHES[s.run % DASHES.length] : [];
    if (same) { label += " (= " + same + ")"; dash = [7, 5]; }  // drawn dashed on top: both stay visible
    var opts = { label: label, stroke: color, width: same ? 1.5 : 2, dash: dash, spanGaps: true,
                 points: { show: s.count < 30, size: 5 }, value: function (u, v) { return fmt(v); } };
    if (s.dots) {  // two evaluations: big points joined by a faint dotted line, in a color of their own
      opts.stroke = PALETTE[(DATA.runs.length + 3 + s.run) % PALETTE.length];
      opts.width = 1; opts.dash = [2, 4]; opts.points = { show: true, size: 9 };
    }
    return opts;
  }

  function linearRange(u, min, max) {
    if (min === max) { var pad = Math.abs(min) * 0.1 || 1; return min === 0 ? [0, 1] : [min - pad, max + pad]; }
    return uPlot.rangeNum(min, max, 0.1, true);
  }

  function yScale(series) {
    if (!state.log) return { distr: 1, range: linearRange };
    var all = [];
    series.forEach(function (s) { s.vals.forEach(function (v) { if (v !== null) all.push(v); }); });
    var positive = all.every(function (v) { return v > 0; });
    if (positive) return { distr: 3, log: 10 };
    var small = all.filter(function (v) { return v !== 0; }).map(Math.abs);
    return { distr: 4, asinh: small.length ? Math.max(1e-6, Math.min.apply(null, small)) : 1 };  // log-like, signs kept
  }

  function onScale(u, key) {
    if (key !== "x" || syncing) return;
    var min = u.scales.x.min, max = u.scales.x.max;
    state.x = u.__full && min <= u.__full[0] && max >= u.__full[1] ? null : [min, max];
    syncing = true;
    plots.forEach(function (p) { if (p.u !== u) p.u.setScale("x", { min: min, max: max }); });
    syncing = false;
  }

  function addWheel(u) {
    u.over.addEventListener("wheel", function (e) {
      e.preventDefault();
      var min = u.scales.x.min, max = u.scales.x.max, w = max - min;
      var pan = e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY);
      if (pan) {
        var dv = Math.abs(e.deltaX) > Math.abs(e.deltaY) ? e.deltaX : e.deltaY;  // some systems turn shift+wheel into deltaX
        var d = (dv > 0 ? 1 : -1) * w * 0.1;
        u.setScale("x", { min: min + d, max: max + d });
        return;
      }
      var x = u.posToVal(e.clientX - u.over.getBoundingClientRect().left, "x");
      var f = e.deltaY < 0 ? 0.8 : 1.25;
      u.setScale("x", { min: x - (x - min) * f, max: x + (max - x) * f });
    }, { passive: false });
  }

  function buildPanel(panel, box, width) {
    var pd = panelData(panel);
    if (!pd.series.length) return;
    var many = DATA.runs.length > 1, w = state.smooth || 0;
    var card = el("div", "plot");
    card.id = "plot-" + panel.id;
    card.appendChild(el("h3", null, panel.title));
    box.appendChild(card);
    var data = [pd.xs].concat(pd.series.map(function (s) { return w > 0 && s.count >= 10 ? smooth(s.vals, w) : s.vals; }));
    var opts = {
      width: width, height: 230,
      scales: { x: { time: false }, y: yScale(pd.series) },
      axes: [{ incrs: INT_INCRS, values: function (u, vs) { return vs.map(function (v) { return Number.isInteger(v) ? String(v) : ""; }); } },
             { size: axisSize, values: function (u, vs) { return vs.map(tickFmt); } }],
      series: [{ label: "step", value: function (u, v) { return v === null || v === undefined ? "--" : String(Math.round(v)); } }]
        .concat(pd.series.map(function (s) { return seriesOpts(panel, s, many); })),
      cursor: { sync: { key: "grpokit" }, drag: { x: true, y: false } },
      hooks: { setScale: [onScale], ready: [addWheel] },
    };
    var u = new uPlot(opts, data, card);
    u.__full = fullX();
    plots.push({ id: panel.id, u: u, series: pd.series.length });
  }

  function buildAll() {
    var box = document.getElementById("plots");
    if (!box) return;
    plots.forEach(function (p) { p.u.destroy(); });
    plots = [];
    box.textContent = "";
    var width = Math.max(300, (box.clientWidth >= 1150 ? box.clientWidth / 2 - 6 : box.clientWidth) - 22);
    DATA.panels.forEach(function (panel) { buildPanel(panel, box, Math.floor(width)); });
    // every panel spans the same steps, step 0 (the evaluation before training) included, so no panel
    // clips a point another one draws; a saved zoom wins
    var r = state.x || fullX();
    plots.forEach(function (p) { syncing = true; p.u.setScale("x", { min: r[0], max: r[1] }); syncing = false; });
  }

  /* [first, last] step over every run's metrics and held-out points. */
  function fullX() {
    var lo = Infinity, hi = -Infinity;
    DATA.runs.forEach(function (run) {
      run.steps.concat((run.heldout || []).map(function (p) { return p[0]; })).forEach(function (s) {
        if (s < lo) lo = s; if (s > hi) hi = s;
      });
    });
    return lo === Infinity ? [0, 1] : lo === hi ? [lo - 1, hi + 1] : [lo, hi];
  }

  /* A doctor finding's link: scroll to its panel and zoom every panel to the steps of its evidence. */
  function linkFindings() {
    Array.prototype.forEach.call(document.querySelectorAll("a.evidence"), function (a) {
      a.addEventListener("click", function (e) {
        var card = document.getElementById("plot-" + a.getAttribute("data-panel"));
        if (!card) return;
        e.preventDefault();
        var steps = (a.getAttribute("data-steps") || "").split(",").map(Number);
        if (steps.length === 2 && !isNaN(steps[0]) && !isNaN(steps[1])) {
          var pad = Math.max(1, Math.round((steps[1] - steps[0]) * 0.1));
          state.x = [steps[0] - pad, steps[1] + pad];
          plots.forEach(function (p) { syncing = true; p.u.setScale("x", { min: state.x[0], max: state.x[1] }); syncing = false; });
        }
        card.scrollIntoView({ block: "center" });
        card.classList.add("flash");
        setTimeout(function () { card.classList.remove("flash"); }, 1500);
      });
    });
  }

  function buildControls() {
    var box = document.getElementById("controls");
    if (!box) return;
    var sm = el("input"); sm.type = "range"; sm.min = "0"; sm.max = "0.99"; sm.step = "0.01"; sm.value = String(state.smooth || 0); sm.id = "smoothing";
    var smv = el("span", null, fmt(+sm.value));
    sm.addEventListener("input", function () { smv.textContent = fmt(+sm.value); });
    sm.addEventListener("change", function () { state.smooth = +sm.value; buildAll(); });
    var lg = el("input"); lg.type = "checkbox"; lg.id = "logscale"; lg.checked = !!state.log;
    lg.addEventListener("change", function () { state.log = lg.checked; buildAll(); });
    var reset = el("button", null, "reset zoom");
    reset.addEventListener("click", function () { state.x = null; buildAll(); });
    var l1 = el("label", null, "smoothing "); l1.appendChild(sm); l1.appendChild(document.createTextNode(" ")); l1.appendChild(smv);
    var l2 = el("label"); l2.appendChild(lg); l2.appendChild(document.createTextNode(" log scale"));
    [l1, l2, reset, el("span", "hint", "hover for values · drag to zoom · wheel to zoom · shift+wheel to pan · double-click to reset")]
      .forEach(function (c) { box.appendChild(c); });
  }

  /* ---- samples browser ---- */
  function turnsOf(c) {
    var box = el("div");
    c.messages.forEach(function (m) {
      var role = m.role === "assistant" ? "model" : String(m.role || "");
      var t = el("div", "turn " + (role === "tool" ? "tool" : role === "model" ? "model" : role));
      t.appendChild(el("span", "who", role === "tool" ? "tool " + (m.name || "") + " →" : role));
      t.appendChild(el("pre", null, typeof m.content === "string" ? m.content : JSON.stringify(m.content)));
      (m.tool_calls || []).forEach(function (call) {
        var fn = (call && call["function"]) || {}, args = fn.arguments;
        t.appendChild(el("div", "call", "call " + (fn.name || "") + "(" + (typeof args === "string" ? args : JSON.stringify(args)) + ")"));
      });
      box.appendChild(t);
    });
    return box;
  }
  function images(list, into) {
    (list || []).forEach(function (uri) {
      if (typeof uri !== "string" || uri.indexOf("data:image/") !== 0) return;
      var img = el("img", "sample-img"); img.src = uri; img.alt = "sample image"; into.appendChild(img);
    });
  }
  function completionTable(comps) {
    var funcs = {}, extras = {};
    comps.forEach(function (c) { Object.keys(c.rewards || {}).forEach(function (k) { funcs[k] = 1; }); Object.keys(c.extra || {}).forEach(function (k) { extras[k] = 1; }); });
    funcs = Object.keys(funcs); extras = Object.keys(extras);
    var table = el("table"), head = el("tr");
    ["#", "reward"].concat(funcs, ["advantage", "length", "finish"], extras, ["completion"]).forEach(function (h) { head.appendChild(el("th", null, h)); });
    table.appendChild(head);
    comps.forEach(function (c) {
      var tr = el("tr");
      tr.appendChild(el("td", "num", c._i)); tr.appendChild(el("td", "num", fmt(c.reward)));
      funcs.forEach(function (f) { tr.appendChild(el("td", "num", fmt((c.rewards || {})[f]))); });
      tr.appendChild(el("td", "num " + (c.advantage > 0 ? "pos" : c.advantage < 0 ? "neg" : ""), fmt(c.advantage)));
      tr.appendChild(el("td", "num", fmt(c.length))); tr.appendChild(el("td", "fin", c.finish_reason));
      extras.forEach(function (x) { var v = (c.extra || {})[x]; tr.appendChild(el("td", typeof v === "number" ? "num" : "", typeof v === "object" && v !== null ? JSON.stringify(v) : fmt(v))); });
      var cell = el("td");
      cell.appendChild(Array.isArray(c.messages) && c.messages.length ? turnsOf(c) : el("pre", null, c.text));
      images(c.images, cell);
      tr.appendChild(cell);
      table.appendChild(tr);
    });
    return table;
  }

  function buildSamples() {
    var box = document.getElementById("samples");
    var runs = DATA.runs.filter(function (r) { return r.samples.length; });
    if (!box || !runs.length) return;
    var bar = el("div", "controls"), list = el("div"), f = {};
    function select(id, label, options) {
      var s = el("select"); s.id = id;
      options.forEach(function (o) { var op = el("option", null, o[1]); op.value = o[0]; s.appendChild(op); });
      var l = el("label", null, label + " "); l.appendChild(s); bar.appendChild(l); f[id] = s; return s;
    }
    function input(id, label, type) {
      var i = el("input"); i.id = id; i.type = type; i.size = 8; if (type === "number") i.step = "any";
      var l = el("label", null, label + " "); l.appendChild(i); bar.appendChild(l); f[id] = i; return i;
    }
    var all = [];
    DATA.runs.forEach(function (r, ri) { r.samples.forEach(function (row) { all.push({ run: ri, row: row }); }); });
    if (DATA.runs.length > 1) select("s-run", "run", [["", "all"]].concat(DATA.runs.map(function (r, i) { return [String(i), r.name]; })));
    var steps = {}, fins = {};
    all.forEach(function (x) { steps[x.row.step] = 1; x.row.completions.forEach(function (c) { fins[c.finish_reason] = 1; }); });
    var stepList = Object.keys(steps).map(Number).sort(function (a, b) { return a - b; });
    select("s-step", "step", [["", "all"]].concat(stepList.map(function (s) { return [String(s), String(s)]; })))
      .value = stepList.length ? String(stepList[stepList.length - 1]) : "";
    input("s-rmin", "reward ≥", "number"); input("s-rmax", "reward ≤", "number");
    select("s-finish", "finish", [["", "all"]].concat(Object.keys(fins).map(function (k) { return [k, k]; })));
    input("s-text", "text contains", "search");
    var count = el("span", "hint"); bar.appendChild(count);
    function render() {
      list.textContent = "";
      var run = f["s-run"] ? f["s-run"].value : "", step = f["s-step"].value, fin = f["s-finish"].value, text = f["s-text"].value.toLowerCase();
      var lo = f["s-rmin"].value === "" ? -Infinity : +f["s-rmin"].value, hi = f["s-rmax"].value === "" ? Infinity : +f["s-rmax"].value;
      var shown = 0, matched = 0;
      all.forEach(function (x) {
        if ((run !== "" && String(x.run) !== run) || (step !== "" && String(x.row.step) !== step)) return;
        var comps = x.row.completions.map(function (c, i) { c._i = i; return c; }).filter(function (c) {
          var blob = (c.text || "") + JSON.stringify(c.messages || "");
          var inRange = typeof c.reward === "number" ? c.reward >= lo && c.reward <= hi : lo === -Infinity && hi === Infinity;
          return inRange && (fin === "" || c.finish_reason === fin) && (!text || blob.toLowerCase().indexOf(text) >= 0);
        });
        if (!comps.length) return;
        matched++;
        if (shown >= 40) return;
        shown++;
        var p = el("div", "prompt");
        p.appendChild(el("div", "meta", "step " + x.row.step + (DATA.runs.length > 1 ? " · " + DATA.runs[x.run].name : "") + " · " + comps.length + " of " + x.row.completions.length + " completions"));
        p.appendChild(el("pre", null, x.row.prompt));
        images(x.row.images, p);
        list.appendChild(p); list.appendChild(completionTable(comps));
      });
      count.textContent = matched + " prompt(s) match" + (matched > shown ? ", first " + shown + " shown" : "");
    }
    Object.keys(f).forEach(function (k) { f[k].addEventListener("input", render); f[k].addEventListener("change", render); });
    box.appendChild(bar); box.appendChild(list);
    render();
  }

  function live() {
    if (!DATA.live || !DATA.live.refresh_s) return;
    var banner = document.getElementById("live");
    banner.hidden = false;
    banner.textContent = "Live: the run is in progress; this page reloads every " + DATA.live.refresh_s + " s (grpokit report --watch rewrites it).";
    setTimeout(function () { saveState(); location.reload(); }, DATA.live.refresh_s * 1000);
  }

  buildControls();
  buildAll();
  linkFindings();
  buildSamples();
  if (state.scrollY) window.scrollTo(0, state.scrollY);
  live();
  var resizeTimer = null;
  window.addEventListener("resize", function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(buildAll, 200); });
  window.grpokitReport = { plots: function () { return plots; }, data: DATA };  // for tests and the console
})();
