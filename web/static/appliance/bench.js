// Benchmark detail page: polls the run from the REST API (progress: level i of N, requests
// done), then draws the speedup table, the per-level table and two uPlot charts
// (output throughput and TPOT against concurrency, one line per deployment).
(function () {
  "use strict";
  const COLORS = ["#0969da", "#cf222e", "#1a7f37"];
  const script = document.currentScript;
  const api = script.dataset.api;
  const ACTIVE = ["queued", "running", "cancelling"];
  const charts = {};

  function fixed(v, d) { return v === null || v === undefined ? "–" : Number(v).toFixed(d); }
  function cell(text) { const td = document.createElement("td"); td.textContent = text; return td; }
  function row(tbody, cells, cls) {
    const tr = document.createElement("tr");
    if (cls) { tr.className = cls; }
    cells.forEach(function (c) { tr.appendChild(cell(c)); });
    tbody.appendChild(tr);
  }

  function showProgress(run) {
    const p = run.progress || {};
    const bar = document.getElementById("bench-progress");
    const steps = p.steps || 1, total = p.total || 1;
    bar.value = run.status === "done" ? 1 : ((p.step || 1) - 1 + (p.done || 0) / total) / steps;
    document.getElementById("bench-progress-text").textContent = run.status === "done" ? "done"
      : "level " + (p.step || 0) + " of " + (p.steps || "?") + " (" + (p.target || "") +
        ", concurrency " + (p.level || "?") + "): " + (p.done || 0) + "/" + (p.total || "?") + " requests";
    document.getElementById("bench-status").textContent = run.status;
    const err = document.getElementById("bench-error");
    err.hidden = !run.error;
    // A traceback's last lines name the exception; a run's own message is one line.
    err.textContent = run.error ? run.error.trim().split("\n").slice(-3).join(" ") : "";
    const warn = document.getElementById("bench-warning");
    const failed = run.failed_requests || 0;
    warn.hidden = !failed || !!run.error;
    warn.textContent = failed + " request" + (failed === 1 ? "" : "s") +
      " failed; the levels with errors are marked below.";
  }

  function showTables(results) {
    const speed = document.querySelector("#speedup-table tbody");
    speed.textContent = "";
    (results.speedups || []).forEach(function (r) {
      row(speed, [r.target, r.concurrency, fixed(r.throughput_ratio, 2) + "x",
        fixed(r.tpot_ratio, 2) + "x", r.verdict], "speedup");
    });
    const levels = document.querySelector("#levels-table tbody");
    levels.textContent = "";
    (results.levels || []).forEach(function (m) {
      const accept = m.request_accept_len === null ? m.accept_len : m.request_accept_len;
      row(levels, [m.target, m.concurrency, m.completed, m.errors, fixed(m.request_throughput, 2),
        fixed(m.output_throughput, 1), fixed(m.ttft_ms.mean, 1) + " / " + fixed(m.ttft_ms.p99, 1),
        fixed(m.tpot_ms.mean, 2) + " / " + fixed(m.tpot_ms.p99, 2),
        fixed(m.itl_ms.mean, 2) + " / " + fixed(m.itl_ms.p99, 2), fixed(m.e2e_ms.mean, 1),
        fixed(accept, 2), m.first_error || ""], m.errors ? "level-errors" : "");
    });
  }

  function chart(id, title, unit, levels, get) {
    const targets = [...new Set(levels.map(function (m) { return m.target; }))];
    const xs = [...new Set(levels.map(function (m) { return m.concurrency; }))].sort(function (a, b) { return a - b; });
    const data = [xs].concat(targets.map(function (t) {
      return xs.map(function (x) {
        const m = levels.find(function (l) { return l.target === t && l.concurrency === x; });
        return m ? get(m) : null;
      });
    }));
    const el = document.getElementById(id);
    el.textContent = "";
    const opts = {title: title, width: Math.min(560, el.clientWidth || 560), height: 260,
      scales: {x: {time: false, distr: 3, log: 2}},
      axes: [{label: "concurrency"}, {label: unit}],
      series: [{label: "concurrency"}].concat(targets.map(function (t, i) {
        // spanGaps: the replicas' sum sits at N x each level, where the others have no point
        return {label: t, stroke: COLORS[i % COLORS.length], width: 2, points: {show: true},
          spanGaps: true};
      }))};
    charts[id] = {plot: new uPlot(opts, data, el), series: targets, points: xs.length};
  }

  function showCharts(results) {
    // A run replica by replica also draws the replicas' throughput summed (replica_sum).
    chart("chart-throughput", "Output throughput against concurrency", "tok/s",
      (results.levels || []).concat(results.replica_sum || []),
      function (m) { return m.output_throughput; });
    chart("chart-tpot", "TPOT against concurrency", "ms", results.levels || [],
      function (m) { return m.tpot_ms.mean; });
  }

  function poll() {
    fetch(api, {headers: {Accept: "application/json"}, credentials: "same-origin"})
      .then(function (r) { return r.json(); })
      .then(function (run) {
        showProgress(run);
        if (run.results && run.results.levels) { showTables(run.results); showCharts(run.results); }
        if (ACTIVE.indexOf(run.status) >= 0) { setTimeout(poll, 1000); }
        const cancel = document.getElementById("cancel-form");
        if (cancel && ACTIVE.indexOf(run.status) < 0) { cancel.remove(); }
      })
      .catch(function () { setTimeout(poll, 3000); });
  }

  window.ApplianceBench = {stats: function () {
    const out = {};
    Object.keys(charts).forEach(function (k) {
      // What uPlot draws: the concurrencies (xs) and per series its value at each.
      const drawn = charts[k].plot.data;
      out[k] = {series: charts[k].series, points: charts[k].points, xs: Array.from(drawn[0]),
        values: drawn.slice(1).map(function (ys) { return Array.from(ys); })};
    });
    return out;
  }};
  poll();
}());
