// Detail page charts: the deployment's metric series, drawn with uPlot (vendored under
// static/vendor/uplot). History comes from the REST API, new points from the SSE stream
// (detail.js hands them to ApplianceCharts.push). Each chart's title shows its latest value
// with its unit, so the numbers read without hovering. Redraws are batched per frame.
(function () {
  "use strict";
  const WINDOW_S = 15 * 60;
  const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#bc4c00", "#0a7d8c", "#6e7781"];
  const NO_GPU = "no GPU telemetry on this host";

  function fixed(v, digits) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }
  function ms(v) { return v === null || v === undefined ? null : v * 1000; }
  function pct(v) { return v === null || v === undefined ? null : v * 100; }
  function at(p, key) { return p[key] === undefined ? null : p[key]; }

  // Times read as the rest of the page does: 24-hour UTC (uPlot's own axis is 12-hour local).
  function two(n) { return n < 10 ? "0" + n : String(n); }
  function utcClock(t, seconds) {
    const d = new Date(t * 1000);
    const hm = two(d.getUTCHours()) + ":" + two(d.getUTCMinutes());
    return seconds ? hm + ":" + two(d.getUTCSeconds()) : hm;
  }
  function utcStamp(t) { return new Date(t * 1000).toISOString().slice(0, 19).replace("T", " ") + " UTC"; }
  // Tick labels: HH:MM, with seconds when ticks are under a minute apart, the date at midnight.
  function utcTicks(splits, incr) {
    return splits.map(function (t) {
      if (incr >= 86400 || (t % 86400 === 0 && incr >= 60)) return new Date(t * 1000).toISOString().slice(5, 10);
      return utcClock(t, incr < 60);
    });
  }

  // What each chart draws: its series (a label and how to read a point) and its title's text.
  const CHARTS = [
    {id: "throughput", title: "Output throughput", unit: "tok/s",
      series: [{label: "output", get: function (p) { return at(p, "throughput"); }},
               {label: "prompt", get: function (p) { return at(p, "input_throughput"); }}],
      latest: function (p) { return fixed(p.throughput, 1) + " tok/s"; }},
    {id: "accept", title: "Acceptance length", unit: "tokens/step",
      series: [{label: "accept length", get: function (p) { return at(p, "accept_len"); }}],
      latest: function (p) {
        return p.accept_len === null || p.accept_len === undefined ? "– (not decoding)"
          : fixed(p.accept_len, 2) + " tokens/step · rate " + fixed(p.accept_rate, 2);
      }},
    {id: "requests", title: "Requests", unit: "requests",
      series: [{label: "running", get: function (p) { return at(p, "running"); }},
               {label: "queued", get: function (p) { return at(p, "queued"); }}],
      latest: function (p) { return fixed(p.running, 0) + " running · " + fixed(p.queued, 0) + " queued"; }},
    {id: "latency", title: "Latency (30 s window)", unit: "ms",
      series: [{label: "ITL p50", get: function (p) { return ms(p.itl_p50); }},
               {label: "ITL p99", get: function (p) { return ms(p.itl_p99); }},
               {label: "TTFT p50", get: function (p) { return ms(p.ttft_p50); }},
               {label: "TTFT p99", get: function (p) { return ms(p.ttft_p99); }}],
      latest: function (p) {
        return "ITL p50 " + fixed(ms(p.itl_p50), 1) + " ms · TTFT p99 " + fixed(ms(p.ttft_p99), 0) + " ms";
      }},
    {id: "kv", title: "KV cache usage", unit: "%",
      series: [{label: "KV usage", get: function (p) { return pct(p.kv_usage); }}],
      latest: function (p) { const v = pct(p.kv_usage); return fixed(v, v !== null && v < 1 ? 2 : 1) + " %"; }},
    {id: "gpu-util", title: "GPU utilisation", unit: "%", gpu: 0,
      latest: function (p) { return gpuText(p, 0, 0, " %"); }},
    {id: "gpu-mem", title: "GPU memory used", unit: "GB", gpu: 1,
      latest: function (p) { return gpuText(p, 1, 1, " GB") + gpuTotal(p); }},
  ];

  function gpuText(p, col, digits, unit) {
    const rows = p.gpus || [];
    if (!rows.length) return NO_GPU;
    const values = rows.map(function (r) { return r[col]; }).filter(function (v) { return v !== null; });
    if (!values.length) return "–";
    const mean = values.reduce(function (a, b) { return a + b; }, 0) / values.length;
    return (rows.length > 1 ? "mean " : "") + mean.toFixed(digits) + unit;
  }

  function gpuTotal(p) {
    const rows = p.gpus || [];
    return rows.length && rows[0][2] ? " of " + rows[0][2].toFixed(0) + " GB" : "";
  }

  function gpuSeries(chart, count) {
    const out = [];
    for (let i = 0; i < count; i++) {
      out.push({label: "GPU " + i, get: (function (idx) {
        return function (p) { const r = (p.gpus || [])[idx]; return r ? r[chart.gpu] : null; };
      })(i)});
    }
    return out;
  }

  const state = {points: [], charts: {}, dirty: false, stats: {pushes: 0, drawMs: 0, maxDrawMs: 0, draws: 0}};

  function plotOptions(chart, width) {
    const time = {label: "UTC", value: function (u, t) { return t === null || t === undefined ? "–" : utcStamp(t); }};
    const series = [time].concat(chart.series.map(function (s, i) {
      return {label: s.label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false,
        value: function (u, v) { return v === null || v === undefined ? "–" : v.toFixed(2); }};
    }));
    return {width: width, height: 170, series: series, legend: {show: true, live: false},
      cursor: {drag: {x: false, y: false}},
      scales: {x: {time: true}, y: {range: function (u, lo, hi) { return [Math.min(0, lo || 0), Math.max(hi || 1, 1e-9) * 1.1]; }}},
      // Splits at whole UTC minutes and hours, whatever the browser's zone.
      tzDate: function (t) { return uPlot.tzDate(new Date(t * 1000), "Etc/UTC"); },
      axes: [{stroke: "#6b7480", grid: {stroke: "#eef0f3"}, values: function (u, splits, i, space, incr) {
               chart.ticks = utcTicks(splits, incr);  // what was drawn, for ApplianceCharts.ticks
               return chart.ticks;
             }},
             {label: chart.unit, stroke: "#6b7480", grid: {stroke: "#eef0f3"}, size: 56}]};
  }

  function dataOf(chart) {
    const xs = state.points.map(function (p) { return p.t; });
    return [xs].concat(chart.series.map(function (s) { return state.points.map(s.get); }));
  }

  function build(chart) {
    const box = document.getElementById("chart-" + chart.id);
    const plotEl = box.querySelector(".plot");
    plotEl.innerHTML = "";
    if (chart.plot) chart.plot.destroy();
    chart.plot = new uPlot(plotOptions(chart, Math.max(plotEl.clientWidth, 200)), dataOf(chart), plotEl);
  }

  function ensureGpuCharts(point) {
    const count = (point.gpus || []).length;
    CHARTS.forEach(function (chart) {
      if (chart.gpu === undefined) return;
      const box = document.getElementById("chart-" + chart.id);
      box.classList.toggle("no-data", count === 0);
      if (chart.gpu > 0) box.hidden = count === 0;  // one "no telemetry" line is enough
      if (count && (!chart.series || chart.series.length !== count)) {
        chart.series = gpuSeries(chart, count);
        build(chart);
      }
    });
  }

  function showLatest(point) {
    CHARTS.forEach(function (chart) {
      document.getElementById("latest-" + chart.id).textContent = chart.latest(point);
    });
  }

  function draw() {
    state.dirty = false;
    const started = performance.now();
    CHARTS.forEach(function (chart) { if (chart.plot) chart.plot.setData(dataOf(chart)); });
    // uPlot paints in a microtask it queued above: this one runs after it.
    queueMicrotask(function () {
      const took = performance.now() - started;
      state.stats.draws += 1;
      state.stats.drawMs += took;
      state.stats.maxDrawMs = Math.max(state.stats.maxDrawMs, took);
    });
  }

  function schedule() {
    if (state.dirty) return;
    state.dirty = true;
    requestAnimationFrame(draw);
  }

  function add(point) {
    const last = state.points[state.points.length - 1];
    if (last && point.t <= last.t) return false;  // a point the history already had
    state.points.push(point);
    const oldest = point.t - WINDOW_S;
    while (state.points.length && state.points[0].t < oldest) state.points.shift();
    return true;
  }

  function reveal() {
    const section = document.getElementById("charts");
    if (!section.hidden) return;
    section.hidden = false;
    resize();  // built while hidden, at no width
  }

  function refresh(point) {
    reveal();
    ensureGpuCharts(point);
    showLatest(point);
    schedule();
  }

  function push(point) {
    state.stats.pushes += 1;
    if (add(point)) refresh(point);
  }

  function load(url) {
    return fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then(function (r) { return r.ok ? r.json() : {points: []}; })
      .then(function (body) {
        (body.points || []).forEach(add);
        const last = state.points[state.points.length - 1];
        if (last) refresh(last);
      })
      .catch(function () { /* the live points fill the charts anyway */ });
  }

  function resize() {
    CHARTS.forEach(function (chart) {
      if (!chart.plot) return;
      const el = document.getElementById("chart-" + chart.id).querySelector(".plot");
      chart.plot.setSize({width: Math.max(el.clientWidth, 200), height: 170});
    });
  }

  function card(chart) {
    const box = document.createElement("div");
    box.className = "chart";
    box.id = "chart-" + chart.id;
    const title = document.createElement("h3");
    title.textContent = chart.title + " ";
    const latest = document.createElement("span");
    latest.className = "latest";
    latest.id = "latest-" + chart.id;
    latest.textContent = "–";
    title.appendChild(latest);
    const plot = document.createElement("div");
    plot.className = "plot";
    box.appendChild(title);
    box.appendChild(plot);
    return box;
  }

  function init() {
    const grid = document.getElementById("chart-grid");
    CHARTS.forEach(function (chart) { grid.appendChild(card(chart)); });
    CHARTS.forEach(function (chart) { if (chart.gpu === undefined) build(chart); });
    window.addEventListener("resize", resize);
  }

  window.ApplianceCharts = {
    init: init, push: push, load: load,
    ticks: function (id) {
      const chart = CHARTS.find(function (c) { return c.id === id; });
      return chart && chart.ticks ? chart.ticks.slice() : [];
    },
    stats: function () { return Object.assign({points: state.points.length}, state.stats); },
  };
})();
