// Tune detail page: polls the Tune from the REST API (which candidate, which phase and level,
// the time left), then draws the recommendation, the candidates, the per-level table and a
// uPlot chart of output throughput against concurrency, one line per candidate.
(function () {
  "use strict";
  const COLORS = ["#57606a", "#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#0a3069"];
  const script = document.currentScript;
  const api = script.dataset.api;
  const ACTIVE = ["queued", "running", "cancelling"];
  const charts = {};

  function fixed(v, d) { return v === null || v === undefined ? "–" : Number(v).toFixed(d); }
  function row(tbody, cells, cls) {
    const tr = document.createElement("tr");
    if (cls) { tr.className = cls; }
    cells.forEach(function (c) { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); });
    tbody.appendChild(tr);
    return tr;
  }
  function lossless(c) {
    const l = c.lossless;
    if (!l) { return "–"; }
    if (l.baseline) { return "baseline"; }
    if (l.passed === true) { return "passed (" + l.identical + "/" + l.total + " identical, " + l.near_ties + " near-ties)"; }
    if (l.passed === false) { return "FAILED: " + (l.error || (l.failures + " of " + l.total + " diverge at a clear margin")); }
    return "not checked" + (l.error ? ": " + l.error : "");
  }

  function showProgress(run) {
    const p = run.progress || {};
    const bar = document.getElementById("tune-progress");
    const count = p.count || 1;
    const inLevel = p.total ? (p.done || 0) / p.total : 0;
    bar.value = ACTIVE.indexOf(run.status) < 0 ? 1 : Math.max(0, ((p.index || 1) - 1 + inLevel * 0.9) / count);
    let text = run.status;
    if (ACTIVE.indexOf(run.status) >= 0 && p.candidate) {
      text = "candidate " + p.index + " of " + p.count + ": " + p.candidate + ", " + p.phase +
        (p.phase === "benchmark" && p.level ? " at concurrency " + p.level + " (" + (p.done || 0) + "/" + (p.total || "?") + " requests)" : "") +
        "; time left " + Math.round(p.time_left_s || 0) + " s";
    }
    document.getElementById("tune-progress-text").textContent = text;
    document.getElementById("tune-status").textContent = run.status;
    const hold = document.getElementById("tune-hold");
    hold.hidden = !run.hold;
    hold.textContent = run.hold ? run.hold.text.charAt(0).toUpperCase() + run.hold.text.slice(1) + "." : "";
    const err = document.getElementById("tune-error");
    err.hidden = !run.error;
    err.textContent = run.error ? run.error.trim().split("\n").slice(-3).join(" ") : "";
  }

  function showResults(run) {
    const r = run.results || {};
    document.getElementById("tune-simulator").hidden = !r.simulator;
    const restore = document.getElementById("tune-restore");
    if (r.restore) { restore.hidden = false; restore.textContent = "Restore: " + r.restore.message; }
    const rec = r.recommendation || {};
    document.getElementById("tune-summary").textContent = rec.summary || "–";
    document.getElementById("tune-crossover").textContent = rec.crossover === null || rec.crossover === undefined
      ? "none: speculation pays at every level measured" : "concurrency " + rec.crossover;
    const ranges = document.querySelector("#ranges-table tbody");
    ranges.textContent = "";
    (rec.per_level || []).forEach(function (e) {
      row(ranges, [e.concurrency, e.candidate || "none may be recommended", fixed(e.output_throughput, 1),
        e.speedup ? fixed(e.speedup, 2) + "x" : "–"], "recommended");
    });
    const cands = document.querySelector("#candidates-table tbody");
    cands.textContent = "";
    (r.candidates || []).forEach(function (c) {
      const finding = (c.findings || []).join(" ") || c.error || "";
      const tr = row(cands, [c.name, c.algorithm, c.state, lossless(c), finding],
        c.lossless && c.lossless.passed === false ? "lossless-failed" : "");
      tr.dataset.candidate = c.name;
    });
    const levels = document.querySelector("#levels-table tbody");
    levels.textContent = "";
    (r.rows || []).forEach(function (m) {
      row(levels, [m.candidate, m.concurrency, m.completed, m.errors, fixed(m.output_throughput, 1),
        fixed(m.ttft_ms.p50, 1) + " / " + fixed(m.ttft_ms.p99, 1),
        fixed(m.tpot_ms.p50, 2) + " / " + fixed(m.tpot_ms.p99, 2),
        fixed(m.request_accept_len === null || m.request_accept_len === undefined ? m.accept_len : m.request_accept_len, 2)],
        m.errors ? "level-errors" : "");
    });
    if ((r.rows || []).length) { chart(r.rows); }
    const form = document.getElementById("apply-form");
    const names = [...new Set((rec.per_level || []).map(function (e) { return e.candidate; }).filter(Boolean))];
    form.hidden = run.status !== "done" || !names.length;
    const select = document.getElementById("apply-candidate");
    if (select.options.length !== names.length) {
      select.textContent = "";
      names.forEach(function (n) {
        const o = document.createElement("option"); o.value = n; o.textContent = n;
        if (n === run.recommended) { o.selected = true; }
        select.appendChild(o);
      });
    }
    const applied = document.getElementById("tune-applied");
    applied.hidden = !run.applied || !run.applied.state;
    if (run.applied && run.applied.state) {
      applied.textContent = "Apply " + run.applied.candidate + ": " + run.applied.state +
        (run.applied.message ? " (" + run.applied.message + ")" : "");
    }
  }

  function chart(rows) {
    const names = [...new Set(rows.map(function (m) { return m.candidate; }))];
    const xs = [...new Set(rows.map(function (m) { return m.concurrency; }))].sort(function (a, b) { return a - b; });
    const data = [xs].concat(names.map(function (n) {
      return xs.map(function (x) {
        const m = rows.find(function (l) { return l.candidate === n && l.concurrency === x; });
        return m ? m.output_throughput : null;
      });
    }));
    const el = document.getElementById("chart-throughput");
    el.textContent = "";
    const opts = {title: "Output throughput against concurrency, per candidate",
      width: Math.min(640, el.clientWidth || 640), height: 280,
      scales: {x: {time: false, distr: 3, log: 2}},
      axes: [{label: "concurrency"}, {label: "tok/s"}],
      series: [{label: "concurrency"}].concat(names.map(function (n, i) {
        return {label: n, stroke: COLORS[i % COLORS.length], width: 2, points: {show: true}, spanGaps: true};
      }))};
    charts.throughput = {plot: new uPlot(opts, data, el), series: names, points: xs.length};
  }

  function poll() {
    fetch(api, {headers: {Accept: "application/json"}, credentials: "same-origin"})
      .then(function (r) { return r.json(); })
      .then(function (run) {
        showProgress(run);
        showResults(run);
        const applying = run.applied && ["queued", "running"].indexOf(run.applied.state) >= 0;
        if (ACTIVE.indexOf(run.status) >= 0 || applying) { setTimeout(poll, 1000); }
        const cancel = document.getElementById("cancel-form");
        if (cancel && ACTIVE.indexOf(run.status) < 0) { cancel.remove(); }
      })
      .catch(function () { setTimeout(poll, 3000); });
  }

  window.ApplianceTune = {stats: function () {
    const out = {};
    Object.keys(charts).forEach(function (k) { out[k] = {series: charts[k].series, points: charts[k].points}; });
    return out;
  }};
  poll();
}());
