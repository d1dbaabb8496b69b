// The dashboard's charts (uPlot, vendored) and sortable tables. Plain JS, no build step.
// Each chart element gets data-points (x positions with a value) and window.ledgerCharts[name].
(function () {
  "use strict";
  const charts = (window.ledgerCharts = {});
  const main = document.getElementById("page");
  const tz = main.dataset.tz || "UTC";
  const colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const fmt = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
  const stepFormats = [];

  // tick labels with the decimals the step between ticks needs (0.0005 apart: four), thousands separated
  function tickValues(u, splits, axisIndex, space, step) {
    let digits = 0;
    while (digits < 12 && Math.abs(Math.round(step * 10 ** digits) - step * 10 ** digits) > 1e-6) digits++;
    stepFormats[digits] ??= new Intl.NumberFormat("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
    return splits.map((v) => (v === null || v === undefined ? v : stepFormats[digits].format(v)));
  }

  function countPoints(data) {
    let n = 0;
    for (let i = 0; i < data[0].length; i++) {
      for (let s = 1; s < data.length; s++) {
        if (data[s][i] !== null && data[s][i] !== undefined) { n++; break; }
      }
    }
    return n;
  }

  // A y axis as wide as its widest label (uPlot's fixed 50 px cut "40,000" to ",000" and pushed the
  // rotated axis title into the numbers). uPlot asks again while sizes change; after two rounds, keep.
  // Never narrower than uPlot's 50 px: the time axis centres its first date under the y axis.
  const MIN_AXIS_PX = 50;
  const measure = document.createElement("canvas").getContext("2d");
  function fitAxis(u, values, axisIndex, cycle) {
    const axis = u.axes[axisIndex];
    if (cycle > 1) return axis._size;
    if (!values) return MIN_AXIS_PX;
    measure.font = axis.font[0];
    const widest = values.reduce((w, v) => Math.max(w, v == null ? 0 : measure.measureText(String(v)).width), 0) / uPlot.pxRatio;
    return Math.max(MIN_AXIS_PX, Math.ceil((axis.ticks.show === false ? 0 : axis.ticks.size) + axis.gap + widest) + 2);
  }

  function draw(name, opts, data) {
    const el = document.querySelector('[data-chart="' + name + '"]');
    if (!el) return null;
    if (charts[name]) charts[name].destroy();
    el.textContent = "";
    const base = { width: Math.max(320, el.clientWidth || 640), height: 260, tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), tz) };
    // every axis but the first (x) is a y axis here: sized to its labels, unless a chart says otherwise
    const axes = (opts.axes || [{}, {}]).map((a, i) => (i === 0 ? a : Object.assign({ size: fitAxis, values: tickValues }, a)));
    const plot = new uPlot(Object.assign(base, opts, { axes: axes }), data, el);
    charts[name] = plot;
    el.dataset.points = String(countPoints(data));
    return plot;
  }

  function bars(align, size) {
    return uPlot.paths.bars({ size: [size || 0.6, 60], align: align || 0 });
  }

  // An x axis of named positions 0..n-1, every step-th labelled: at most ~14, and never closer than the
  // widest label needs (on a phone, 20 tickers side by side overlapped). y from zero: counts and means
  // are read against their bar's height.
  const LABEL_GAP_PX = 8;
  const fromZero = { range: (u, lo, hi) => [0, hi * 1.1 || 1] };
  function categories(labels) {
    function splits(u) {
      measure.font = u.axes[0].font[0];
      const widest = labels.reduce((w, l) => Math.max(w, measure.measureText(String(l ?? "")).width), 0) / uPlot.pxRatio;
      const slot = u.bbox.width / uPlot.pxRatio / Math.max(1, labels.length);
      const step = Math.max(1, Math.ceil(labels.length / 14), Math.ceil((widest + LABEL_GAP_PX) / slot));
      return labels.map((_, i) => i).filter((i) => i % step === 0);
    }
    return {
      scales: { x: { time: false, range: [-0.5, Math.max(0.5, labels.length - 0.5)] }, y: fromZero },
      axes: [
        { splits: splits, values: (u, splits) => splits.map((i) => String(labels[i] ?? "")) },
        { values: tickValues },
      ],
    };
  }

  // x from the first bin's left edge to the last one's right (uPlot's own range ends at the outer bars' middles,
  // cutting them in half); one bin of equal values gets a little room either side
  function histogram(name, h) {
    const mids = h.counts.map((_, i) => (h.edges[i] + h.edges[i + 1]) / 2);
    const lo = h.edges[0], hi = h.edges[h.edges.length - 1];
    const pad = hi - lo > 1e-6 ? 0 : Math.max(Math.abs(lo) * 0.1, 1e-3);
    draw(name, {
      scales: { x: h.edges.length ? { time: false, range: [lo - pad, hi + pad] } : { time: false } },
      axes: [{ label: h.unit, values: tickValues }, {}],
      series: [{ label: h.unit }, { label: "calls", fill: colours[0] + "88", stroke: colours[0], paths: bars(0, 0.9) }],
    }, [mids, h.counts]);
  }

  // bar `index` of `count` side by side at each of `n` categories (x in value units: category i spans i ± 0.4)
  function groupedBars(index, count, n) {
    const width = 0.8 / count;
    return uPlot.paths.bars({
      disp: {
        x0: { unit: 1, values: () => Array.from({ length: n }, (_, i) => i - 0.4 + index * width) },
        size: { unit: 1, values: () => [width] },
      },
    });
  }

  async function getJson(url) {
    const res = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!res.ok) throw new Error(url + " answered " + res.status);
    return res.json();
  }

  function setSource(key, text) {
    const el = document.querySelector('[data-source="' + key + '"]');
    if (el && text) el.textContent = text;
  }

  const pages = {
    async runs() {
      const el = document.querySelector('[data-chart="runs-throughput"]');
      const chart = (await getJson(el.dataset.src)).chart;
      const series = [{}].concat(chart.groups.map((g, i) => ({
        label: g === null ? "(none)" : g, stroke: colours[i % colours.length], paths: () => null,
        points: { show: true, size: 9, fill: colours[i % colours.length] },
      })));
      draw("runs-throughput", { series: series, axes: [{}, { label: "tok/s" }] }, [chart.x].concat(chart.y));
    },

    async run() {
      const root = document.getElementById("run");
      const view = await getJson(root.dataset.src);
      const r = view.run;
      for (const cell of document.querySelectorAll("[data-field]")) {
        const v = r[cell.dataset.field];
        cell.textContent = v === null || v === undefined ? "–" : typeof v === "number" ? fmt.format(v) : String(v);
      }
      draw("in-flight", {
        series: [{}, { label: "in flight", stroke: colours[0], fill: colours[0] + "33", paths: uPlot.paths.stepped({ align: 1 }) }],
      }, [view.in_flight.x, view.in_flight.y]);
      setSource("in_flight", view.in_flight.source);
      draw("output-rate", { series: [{}, { label: "output tok/s", stroke: colours[1] }] }, [view.output_rate.x, view.output_rate.y]);
      setSource("output_rate", view.output_rate.source);
      histogram("ttft", view.ttft);
      setSource("ttft", view.ttft.source);
      histogram("tpot", view.tpot);
      setSource("tpot", view.tpot.source);
      const tickers = view.tickers.map((t) => t.ticker);
      draw("tickers", Object.assign(categories(tickers), {
        series: [{}, { label: "calls", fill: colours[2] + "88", stroke: colours[2], paths: bars(0, 0.8) }],
      }), [tickers.map((_, i) => i), view.tickers.map((t) => t.calls)]);
      if (view.server) {
        const s = view.server;
        draw("server", {
          scales: { frac: { range: [0, 1] } },
          axes: [{}, { scale: "n", label: "requests" }, { scale: "frac", side: 1, label: "fraction", grid: { show: false } }],
          series: [{},
            { label: "KV cache usage", scale: "frac", stroke: colours[3] },
            { label: "acceptance rate", scale: "frac", stroke: colours[4] },
            { label: "running", scale: "n", stroke: colours[0] },
            { label: "waiting", scale: "n", stroke: colours[1] }],
        }, [s.x, s.kv_cache_usage, s.acceptance_rate, s.running, s.waiting]);
        setSource("server", s.source);
      }
      document.getElementById("live-badge").hidden = !view.live;
      if (view.live) setTimeout(() => pages.run(), 3000);
    },

    async eras() {
      const el = document.querySelector('[data-chart="eras"]');
      const view = await getJson(el.dataset.src);
      const names = view.groups.map((g) => (g === null ? "(none)" : g));
      const formulas = Object.keys(view.eras);
      const series = [{}].concat(formulas.map((f, i) => ({
        label: f, fill: colours[i] + "99", stroke: colours[i], paths: bars(i === 0 ? -1 : 1, 0.35),
      })));
      const data = [names.map((_, i) => i)].concat(formulas.map((f) => view.groups.map((g) => {
        const row = view.eras[f].find((e) => e.group === g);
        return row ? row.mean_throughput_tps : null;
      })));
      const opts = categories(names);
      draw("eras", Object.assign(opts, { series: series }), data);
    },

    async daily() {
      const el = document.querySelector('[data-chart="daily"]');
      const view = await getJson(el.dataset.src);
      // input and output tokens differ tenfold: each on its own axis, coloured as its bars (the page says so)
      const tokenAxes = (first) => [first,
        { scale: "in", label: "input tokens (left scale)", stroke: colours[0], values: tickValues },
        { scale: "out", side: 1, label: "output tokens (right scale)", stroke: colours[1], grid: { show: false }, values: tickValues }];
      const tokenSeries = () => [{}, { label: "input tokens", scale: "in", fill: colours[0] + "99", stroke: colours[0], paths: bars(-1, 0.35) },
        { label: "output tokens", scale: "out", fill: colours[1] + "99", stroke: colours[1], paths: bars(1, 0.35) }];
      const days = view.days.map((d) => d.day);
      const perDay = categories(days);
      Object.assign(perDay.scales, { in: fromZero, out: fromZero });
      perDay.axes = tokenAxes(perDay.axes[0]);
      draw("daily", Object.assign(perDay, { series: tokenSeries() }),
        [days.map((_, i) => i), view.days.map((d) => d.input_tokens), view.days.map((d) => d.output_tokens)]);
      const names = view.weekdays.map((w) => w.weekday);
      const weekly = categories(names);
      Object.assign(weekly.scales, { in: fromZero, out: fromZero });
      weekly.axes = tokenAxes(weekly.axes[0]);
      draw("weekday", Object.assign(weekly, { series: tokenSeries() }),
        [names.map((_, i) => i), view.weekdays.map((w) => w.input_tokens), view.weekdays.map((w) => w.output_tokens)]);
    },

    async compare() {
      const root = document.getElementById("compare");
      if (!root) return;
      const view = await getJson(root.dataset.src);
      const runs = view.comparison.runs;
      const perRun = (names, value) => {
        const series = [{}].concat(runs.map((r, i) => ({
          label: r.run, fill: colours[i % colours.length] + "99", stroke: colours[i % colours.length],
          paths: groupedBars(i, runs.length, names.length),
        })));
        const opts = categories(names);
        return [Object.assign(opts, { series: series }), [names.map((_, i) => i)].concat(runs.map((r) => names.map((n) => value(r, n))))];
      };
      const formulas = Object.keys(runs[0].throughput_tps);
      const [topts, tdata] = perRun(formulas, (r, f) => r.throughput_tps[f]);
      draw("compare-throughput", topts, tdata);
      // a chart per latency, each on its own scale: TPOT and ITL are often < 1 ms where TTFT is ~200 ms
      for (const metric of ["ttft", "tpot", "itl"]) {
        const [lopts, ldata] = perRun(["p50", "p90", "p99"], (r, part) => (r[metric + "_ms"] ? r[metric + "_ms"][part] : null));
        draw("compare-" + metric, lopts, ldata);
      }
    },
  };

  function sortable(table) {
    table.querySelectorAll("th").forEach((th, col) => {
      th.addEventListener("click", () => {
        const body = table.tBodies[0];
        const rows = Array.from(body.rows).filter((r) => r.cells.length > col);
        const numeric = th.dataset.type === "num";
        const dir = th.dataset.dir === "asc" ? -1 : 1;
        table.querySelectorAll("th").forEach((h) => delete h.dataset.dir);
        th.dataset.dir = dir === 1 ? "asc" : "desc";
        const key = (row) => {
          const cell = row.cells[col];
          const raw = cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent.trim();
          if (!numeric) return raw;
          return raw === "" ? -Infinity : Number(raw);
        };
        rows.sort((a, b) => {
          const ka = key(a), kb = key(b);
          return (ka < kb ? -1 : ka > kb ? 1 : 0) * dir;
        });
        rows.forEach((r) => body.appendChild(r));
      });
    });
  }

  // Compare's picker sends the runs in the order they were ticked (the first is the baseline), not the list's
  function pickInOrder(form) {
    const boxes = Array.from(form.querySelectorAll("input[type=checkbox][name=run]"));
    const order = boxes.filter((b) => b.checked).sort((a, b) => Number(a.dataset.rank) - Number(b.dataset.rank));
    const show = () => boxes.forEach((b) => { b.parentElement.querySelector(".rank").textContent = b.checked ? String(order.indexOf(b) + 1) : ""; });
    boxes.forEach((box) => box.addEventListener("change", () => {
      if (box.checked) order.push(box); else order.splice(order.indexOf(box), 1);
      show();
    }));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const query = new URLSearchParams(order.map((b) => ["run", b.value]));
      window.location.assign(window.location.pathname + "?" + query.toString());
    });
    show();
  }

  // a tick box per run that adds its name to (or takes it from) a comma-separated field, e.g. Decide's groups
  function pickInto(box) {
    const field = box.form.elements[box.dataset.pickInto];
    const names = () => field.value.split(",").map((n) => n.trim()).filter((n) => n !== "");
    box.checked = names().includes(box.value);
    box.addEventListener("change", () => {
      const rest = names().filter((n) => n !== box.value);
      field.value = (box.checked ? rest.concat([box.value]) : rest).join(",");
    });
  }

  document.querySelectorAll("form[data-ordered]").forEach(pickInOrder);
  document.querySelectorAll("input[data-pick-into]").forEach(pickInto);
  document.querySelectorAll("table.sortable").forEach(sortable);
  const run = pages[main.dataset.page];
  if (run) {
    run().then(() => { main.dataset.ready = "1"; }, (err) => { main.dataset.ready = "error"; console.error(err); });
  } else {
    main.dataset.ready = "1";
  }
})();
