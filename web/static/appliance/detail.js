// Detail page: follows the deployment's SSE stream and updates the page in place.
(function () {
  "use strict";
  const script = document.currentScript;
  const streamUrl = script.dataset.stream;
  const order = ["queued", "building", "starting", "checking", "loading", "capturing", "ready"];
  const statusEl = document.getElementById("status");
  const conn = document.getElementById("conn");
  const AGENT_ASK_MS = 5000;  // how often the page asks whether the agent still reports
  const CARDS_WAIT_MS = 10000;  // the build and self-check cards' one request, at most
  const STREAM_OPEN_MS = 15000;  // a live stream not open by then is asked for again
  // A stream answered with an error status (a loaded panel's 500 or 503) is one the browser
  // gives up for good; the page asks again after this long.
  const STREAM_RETRY_MS = 3000;

  let furthest = -1;  // the last phase reached: a failure is shown where it happened
  function setStatus(status) {
    statusEl.textContent = status;
    statusEl.className = "status status-" + status;
    statusEl.dataset.status = status;
    const inOrder = order.indexOf(status);
    if (inOrder >= 0) furthest = inOrder;
    const reached = inOrder >= 0 ? inOrder : furthest;
    document.querySelectorAll("#timeline li").forEach(function (li) {
      const i = order.indexOf(li.dataset.phase);
      li.classList.toggle("done", reached >= 0 && i < reached);
      li.classList.toggle("current", inOrder >= 0 && i === reached);
      li.classList.toggle("failed", status === "failed" && i === reached);
    });
    if (status === "stopped" || status === "failed") {
      const stop = document.getElementById("stop");
      if (stop) stop.disabled = true;
    }
    dropStaleFlashes(status);
  }

  // A flash tagged while-<status> ("Deployment x queued.") reports the status of the moment it
  // was made; once the live status is another one it would contradict the badge, so it goes.
  function dropStaleFlashes(status) {
    document.querySelectorAll(".flash").forEach(function (flash) {
      const tag = Array.from(flash.classList).find(function (c) { return c.indexOf("while-") === 0; });
      if (tag && tag !== "while-" + status) flash.remove();
    });
  }

  function bar(id, done, total, text) {
    const el = document.getElementById(id + "-bar");
    el.max = total || 1;
    el.value = Math.min(done || 0, total || 1);
    document.getElementById(id + "-text").textContent = text;
  }

  function showProgress(p) {
    if (p.weights) {
      // The target's load and the drafter's are told apart: the drafter's short load
      // must not read as the target's.
      const w = p.weights, d = p.draft_weights;
      const loaded = function (x) { return "loaded" + (x.elapsed_s != null ? " in " + x.elapsed_s + " s" : ""); };
      let text = w.finished ? "target " + loaded(w)
        : "target shard " + (w.done || 0) + " / " + (w.total || "?");
      if (d) text += "; drafter " + (d.finished ? loaded(d) : "shard " + (d.done || 0) + " / " + (d.total || "?"));
      bar("weights", w.finished ? (w.total || 1) : w.done, w.total || 1, text);
    }
    if (p.capture) {
      const c = p.capture;
      const who = [c.role, c.mode].filter(Boolean).join(" ");
      const width = c.num_tokens_per_req ? ", " + c.num_tokens_per_req + " tokens/req" : "";
      const text = c.finished ? who + " captured" + width
        : who + " batch " + (c.done || 0) + " / " + (c.total || "?") + (c.bs ? " (bs=" + c.bs + ")" : "") + width;
      bar("capture", c.finished ? (c.total || 1) : c.done, c.total || 1, text);
    }
  }

  // The captured verify width per role beside what the spec needs; a difference is shown
  // at once (the diagnosis card gets the finding from the log parser).
  function showWidth(e) {
    if (e.mode !== "verify" || !e.role || !e.num_tokens_per_req) return;
    const row = document.querySelector('#capture-widths tr[data-role="' + e.role + '"]');
    if (!row) return;
    row.querySelector(".captured").textContent = e.num_tokens_per_req + " tokens/request";
    row.classList.toggle("mismatch", String(e.num_tokens_per_req) !== row.dataset.needed);
  }

  // Each verify graph's memory as its capture line printed it.
  function showGraphMemory(e) {
    if (e.mode !== "verify" || !e.role || e.mem_usage_gb == null) return;
    const cell = document.querySelector('#capture-widths tr[data-role="' + e.role + '"] .graph-mem');
    if (cell) cell.textContent = e.mem_usage_gb + " GB";
  }

  // The weight load's GB/s against the disk's measured rate (summary.load: bytes, read_gbps,
  // expected_s per model); the same words as appliance.store.loadtime.load_text.
  const loadStart = {};
  let summaryLoad = {};
  function duration(s) {
    if (s < 60) return s.toFixed(1) + " s";
    const r = Math.round(s);
    return Math.floor(r / 60) + " min " + String(r % 60).padStart(2, "0") + " s";
  }
  function showRate(key, gbps, elapsed, live) {
    const row = (summaryLoad || {})[key];
    if (!row || !row.bytes) return;
    // appliance.store.loadtime.rate_text's units: never a "0.0" for a tiny checkpoint.
    const rate = gbps >= 0.1 ? gbps.toFixed(2) + " GB/s"
      : gbps >= 1e-4 ? (gbps * 1e3).toFixed(1) + " MB/s"
      : gbps >= 1e-7 ? (gbps * 1e6).toFixed(1) + " kB/s" : (gbps * 1e9).toFixed(0) + " bytes/s";
    let text = (live ? "reading at " + rate + " so far" : "read at " + rate + " in " + elapsed + " s");
    if (row.read_gbps) {
      const share = gbps / row.read_gbps;
      text += ": " + (share >= 0.01 ? Math.round(100 * share) : (100 * share).toFixed(2)) + " % of the disk's measured " + row.read_gbps.toFixed(2) + " GB/s";
    }
    if (row.expected_s != null) text += " (expected " + duration(row.expected_s) + ")";
    const el = document.getElementById(key === "draft_weights" ? "draft-weights-rate" : "weights-rate");
    el.textContent = (key === "draft_weights" ? "drafter: " : "") + text;
    el.hidden = false;
  }
  function showDownload(e) {
    const el = document.getElementById("model-download");
    const pct = e.size_bytes ? " (" + Math.floor(100 * e.bytes_done / e.size_bytes) + " %)" : "";
    el.textContent = "waiting for the model store: " + e.path + " is " + e.state + pct;
    el.hidden = e.state === "ready";
  }

  const progress = {};
  function foldProgress(e) {
    switch (e.kind) {
      case "model_download": showDownload(e); return;
      case "weights_begin":
        progress.loading = e.model === "draft" ? "draft_weights" : "weights";
        progress[progress.loading] = {done: 0, total: null};
        loadStart[progress.loading] = Date.now();
        break;
      case "weights_progress": {
        const key = progress.loading || "weights", row = (summaryLoad || {})[key];
        // A piece of the bar read after its end line (its own stream, in no order with the
        // lines) leaves the finished load and its rate as they are.
        if (progress[key] && progress[key].finished) break;
        progress[key] = {done: e.done, total: e.total};
        const secs = (Date.now() - (loadStart[key] || Date.now())) / 1000;
        if (row && row.bytes && e.total && secs > 0) showRate(key, row.bytes * e.done / e.total / 1e9 / secs, null, true);
        break;
      }
      case "weights_end": {
        const key = e.model === "draft" ? "draft_weights" : "weights", row = (summaryLoad || {})[key];
        progress[key] = Object.assign(progress[key] || {}, {finished: true, elapsed_s: e.elapsed_s});
        if (row && row.bytes && e.elapsed_s) showRate(key, row.bytes / 1e9 / e.elapsed_s, e.elapsed_s, false);
        break;
      }
      case "capture_begin":
        progress.capture = {role: e.role, mode: e.mode, num_tokens_per_req: e.num_tokens_per_req, done: 0, total: null};
        showWidth(e);
        break;
      case "capture_progress": progress.capture = Object.assign(progress.capture || {}, {bs: e.bs, done: e.done, total: e.total, finished: false}); break;
      case "capture_end":
        progress.capture = Object.assign(progress.capture || {}, {finished: true});
        showGraphMemory(e);
        break;
      default: return;
    }
    showProgress(progress);
  }

  // The Decode card, from a decode log line or a scraped /metrics point (whichever is newer).
  function num(v, digits) { return typeof v === "number" ? v.toFixed(digits) : null; }
  function graphText(v) {
    if (v === true || v === 1) return "yes";
    if (v === false || v === 0) return "no (eager)";
    return typeof v === "number" ? Math.round(v * 100) + " % of decode passes" : null;
  }
  function setDecode(values, source) {
    Object.keys(values).forEach(function (k) {
      const el = document.getElementById("stat-" + k);
      if (el && values[k] !== null) el.textContent = values[k];
    });
    document.getElementById("decode-source").textContent = source;
  }
  let pointAt = 0;  // when the last /metrics point was taken (ms)
  let lastPoint = null;
  function showDecode(s) {
    // A recent /metrics point wins: its throughput is over the whole interval, all requests.
    if (Date.now() - pointAt < 10000) return;
    const tput = num(s.gen_throughput, 1);
    setDecode({gen_throughput: tput && tput + " tok/s", accept_len: num(s.accept_len, 2),
      accept_rate: num(s.accept_rate, 2), running_req: num(s.running_req, 0),
      cuda_graph: graphText(s.cuda_graph)}, "from the engine's last decode log line");
  }
  let ended = false;  // stopped or failed: the figures are the last seen, not live
  function showPoint(p) {
    pointAt = p.t * 1000;
    const tput = num(p.throughput, 1);
    const when = new Date(p.t * 1000).toISOString().slice(0, 19).replace("T", " ");
    setDecode({gen_throughput: tput && tput + " tok/s", accept_len: num(p.accept_len, 2) || "– (idle)",
      accept_rate: num(p.accept_rate, 2) || "–", running_req: num(p.running, 0),
      cuda_graph: graphText(p.cuda_graph)},
      ended ? "last seen at " + when + " UTC, before the engine " + statusEl.dataset.status + "; not live"
        : "from /metrics at " + when.slice(11) + " UTC");
  }
  function showEnded(status) {
    ended = true;
    const source = document.getElementById("decode-source");
    if (pointAt) showPoint(lastPoint);
    else source.textContent = "the engine is " + status + ": no live figures";
    document.getElementById("charts-title").textContent =
      "Metrics (as last seen, before the engine " + status + "; not live)";
  }

  // Alerts: one line per alert id, its latest raise (and clear), as the server renders them;
  // a cleared alert keeps its line, marked cleared, so the page says when it happened.
  function utcText(iso) { return new Date(iso).toISOString().slice(0, 19).replace("T", " ") + " UTC"; }
  function showAlert(a, ts) {
    const list = document.getElementById("alert-list");
    let li = list.querySelector('[data-alert="' + a.id + '"]');
    if (!li) {
      li = document.createElement("li");
      li.dataset.alert = a.id;
      li.appendChild(document.createElement("b"));
      li.appendChild(document.createElement("span")).className = "summary";
      li.appendChild(document.createElement("i"));
      li.appendChild(document.createElement("span")).className = "when";
      list.insertBefore(li, list.firstChild);
    }
    const raised = a.raised_at || (a.state === "resolved" ? null : ts);
    li.className = "severity-" + a.severity + (a.state === "resolved" ? " cleared" : "");
    li.children[0].textContent = a.id;
    if (a.state === "resolved") {
      li.children[2].textContent = "";
      li.children[3].textContent = (raised ? "raised " + utcText(raised) + " · " : "") +
        "cleared " + utcText(a.cleared_at || ts) + (a.summary ? ": " + a.summary : "");
    } else {
      li.children[1].textContent = a.summary || "";
      li.children[2].textContent = a.fix || "";
      li.children[3].textContent = "raised " + utcText(raised);
    }
    document.getElementById("alerts").hidden = list.children.length === 0;
  }

  // A finding while running (an engine warning, a note: it has a severity) joins the list of
  // findings, one line per cause; a failure's cause takes the diagnosis card.
  function showFinding(d) {
    const list = document.getElementById("finding-list");
    if (list.querySelector('[data-cause="' + d.cause + '"]')) return;
    const li = document.createElement("li");
    li.className = "finding finding-" + d.severity;
    li.dataset.cause = d.cause;
    li.appendChild(document.createElement("b")).textContent = d.severity;
    li.appendChild(document.createTextNode(" ["));
    li.appendChild(document.createElement("span")).className = "cause";
    li.lastChild.textContent = d.cause;
    li.appendChild(document.createTextNode("] "));
    li.appendChild(document.createElement("span")).className = "summary";
    li.lastChild.textContent = d.summary || "";
    const fix = li.appendChild(document.createElement("i"));
    fix.appendChild(document.createTextNode(" Fix: "));
    fix.appendChild(document.createElement("span")).className = "fix";
    fix.lastChild.textContent = d.fix || "";
    list.appendChild(li);
    document.getElementById("findings").hidden = false;
  }

  function showDiagnosis(d) {
    if (d.severity) { showFinding(d); return; }
    document.getElementById("diagnosis").hidden = false;
    // A finding seen before anything failed (a graph width that will not fit) is not a cause yet.
    document.getElementById("diag-title").textContent = d.fatal === false ? "Finding" : "Why it failed";
    document.getElementById("diag-cause").textContent = d.cause || "";
    document.getElementById("diag-summary").textContent = d.summary || "";
    document.getElementById("diag-fix").textContent = d.fix || "";
  }

  function build(b) {
    if (b.kind === "build_step") {
      bar("build", b.step, b.total, "step " + b.step + " / " + b.total + ": " + (b.text || ""));
    } else if (b.kind === "cache_hit" || b.kind === "built") {
      bar("build", 1, 1, b.text || "");
    } else if (b.kind === "handed_over") {  // built by the joined host that runs it
      bar("build", 0, 1, b.text || "");
    }
  }

  const selfcheck = {reported: false};
  function showSelfcheck(c) {
    const card = document.getElementById("selfcheck");
    const text = document.getElementById("selfcheck-text");
    card.hidden = false;
    switch (c.kind) {
      case "selfcheck_start": text.textContent = "running"; break;
      case "selfcheck_begin": {
        const widths = (c.roles || []).map(function (r) { return r.role + " " + r.width + " wide (" + r.mask + ")"; });
        text.textContent = "running on " + (c.gpus || []).length + " GPU(s)" + (widths.length ? "; CUDA graphs: " + widths.join(", ") : "");
        break;
      }
      case "selfcheck_gpus": {
        const names = (c.gpus || []).map(function (g) { return g.name; });
        document.getElementById("selfcheck-gpus").textContent = names.length + " × " + (names[0] || "GPU") +
          ", driver " + c.driver_version + " (CUDA " + c.cuda_driver_version + ")";
        break;
      }
      case "selfcheck_check": {
        const li = document.createElement("li");
        li.className = "finding check " + (c.ok ? "check-ok" : "check-fail");
        const b = document.createElement("b");
        b.textContent = c.ok ? "ok" : "FAIL";
        li.appendChild(b);
        li.appendChild(document.createTextNode(" [" + c.id + "] " + c.message));
        if (!c.ok && c.fix) {
          const fix = document.createElement("i");
          fix.textContent = " Fix: " + c.fix;
          li.appendChild(fix);
        }
        document.getElementById("selfcheck-checks").appendChild(li);
        break;
      }
      case "selfcheck_report": {
        selfcheck.reported = true;
        const ar = c.allreduce || {};
        const bw = ar.ok && ar.world_size > 1 ? "; all-reduce bus bandwidth " + ar.busbw_gbps + " GB/s" : "";
        text.textContent = (c.ok ? "passed" : "FAILED") + " in " + c.elapsed_s + " s" + bw;
        text.className = c.ok ? "check-ok" : "check-fail";
        break;
      }
      case "selfcheck_exit":
        if (c.rc !== 0 && !selfcheck.reported) {
          text.textContent = "FAILED: the check exited with code " + c.rc + " without a report";
          text.className = "check-fail";
        }
        break;
      default: break;
    }
  }

  // A rolling change's progress (services/rolling.py), from its status events.
  const rollingEl = document.getElementById("rolling");
  function showRolling(r) {
    if (!rollingEl || !r.text) return;
    rollingEl.textContent = r.text;
    rollingEl.dataset.state = r.state;
    rollingEl.className = "rolling rolling-" + r.state;
    rollingEl.hidden = false;
  }

  // The cards an event updates (the log pane takes its line, if it has one, apart).
  function handle(event) {
    const p = event.payload || {};
    switch (event.kind) {
      case "phase": setStatus(p.status); break;
      case "progress": foldProgress(p); break;
      case "metric": if (p.kind === "decode_stats") showDecode(p); break;
      case "point": lastPoint = p; showPoint(p); ApplianceCharts.push(p); break;
      case "behind": showBehind(p); break;
      case "alert": showAlert(p, event.ts); break;
      case "diagnosis": showDiagnosis(p); break;
      case "build": build(p); break;
      case "selfcheck": showSelfcheck(p); break;
      case "status": if (p.rolling) showRolling(p.rolling); break;
      case "end":
        setStatus(p.status);
        if (rollingEl && rollingEl.dataset.state === "rolling") break;  // its next run follows
        showEnded(p.status); source.close(); conn.textContent = "ended"; break;
      default: break;
    }
  }

  const summary = JSON.parse(document.getElementById("summary-data").textContent);
  summaryLoad = summary.load || {};
  // A failure is shown where it happened: the furthest phase this run reached.
  const times = JSON.parse(document.getElementById("status-times").textContent) || {};
  order.forEach(function (status, i) { if (times[status]) furthest = i; });
  setStatus(summary.status);
  if (summary.is_terminal) ended = true;
  if (summary.progress) showProgress(summary.progress);
  if (summary.decode_stats && !summary.is_terminal) showDecode(summary.decode_stats);
  if (summary.metrics) { lastPoint = summary.metrics; showPoint(summary.metrics); }
  ApplianceCharts.init();
  ApplianceCharts.load(script.dataset.metrics + "?start=" + (Date.now() / 1000 - 15 * 60));
  // The page opens at the tail (never the whole record): the last lines it carries, then
  // live from their seq; older lines page in on demand (eventlog.js).
  const lastSeq = Number(script.dataset.after) || 0;
  const logForm = document.getElementById("log-filter");
  ApplianceLog.init({
    pane: document.getElementById("log"), url: script.dataset.history,
    tail: JSON.parse(document.getElementById("log-tail").textContent), lastSeq: lastSeq,
    autoscroll: document.getElementById("autoscroll"), note: document.getElementById("log-note"),
    latest: document.getElementById("log-latest"), form: logForm,
  });
  let source = null;
  let lastSeen = lastSeq;  // the newest seq this page has, where a new stream starts after
  function follow() {
    // A stopped or failed deployment's stream would carry nothing more (its end is in the tail).
    if (summary.is_terminal) { conn.textContent = "ended"; return; }
    if (source) source.close();
    const opening = source = new EventSource(streamUrl + "?after=" + lastSeen);
    let opened = false;
    // Bounded: a stream the panel has not answered by then (its connection stuck) is asked
    // for again, from the newest seq this page has; the browser's own retry covers the rest.
    setTimeout(function () {
      if (source === opening && !opened && opening.readyState === 0) follow();
    }, STREAM_OPEN_MS);
    source.onopen = function () { opened = true; conn.textContent = silent ? silentText(silent) : "live"; };
    source.onerror = function () {
      if (source !== opening) return;
      conn.textContent = "reconnecting…";
      // CLOSED here is the browser's verdict on an answer that was no stream: it will not
      // ask again by itself (a network error leaves it CONNECTING, and it retries).
      if (opening.readyState === 2) {
        setTimeout(function () { if (source === opening) follow(); }, STREAM_RETRY_MS);
      }
    };
    source.onmessage = function (msg) {
      if (msg.lastEventId) lastSeen = Math.max(lastSeen, Number(msg.lastEventId) || 0);
      const event = JSON.parse(msg.data);
      ApplianceLog.live(event);
      caughtUp(event);
      handle(event);
      if (event.kind === "phase" || event.kind === "status") askAgentSoon();
    };
  }
  // The panel says when this page fell behind the live feed (a slow connection or a busy
  // machine): every line still comes, from the record, in order; the connection line says
  // how far behind until the stream reaches the head it named.
  let behindUntil = 0;
  function showBehind(p) {
    behindUntil = p.head;
    conn.textContent = "behind by " + p.behind + " lines: catching up from the record";
  }
  function caughtUp(event) {
    if (!behindUntil || event.kind === "behind" || !(event.seq >= behindUntil)) return;
    behindUntil = 0;
    conn.textContent = silent ? silentText(silent) : "live";
  }
  // A silent agent sends nothing down the stream, which stays open (the panel is up): the
  // page asks whether the deployment's agent still reports (views.deployment_agent) and
  // shows `unknown` with an agent-silent alert while it does not, the stored status again
  // (the alert marked cleared) once it does.
  let silent = null;
  function silentText(s) { return "not live: the agent is silent since " + utcText(s.last_seen); }
  function showSilence(s) {
    if (s) {
      showAlert({id: "agent-silent", severity: "critical", state: "firing", summary: s.summary,
                 fix: s.fix, raised_at: s.last_seen}, s.last_seen);
      statusEl.textContent = "unknown";
      statusEl.className = "status status-unknown";
      statusEl.title = "last known " + statusEl.dataset.status;
      conn.textContent = silentText(s);
    } else if (silent) {
      showAlert({id: "agent-silent", severity: "critical", state: "resolved", raised_at: silent.last_seen,
                 cleared_at: new Date().toISOString(), summary: "the agent reports again"}, null);
      statusEl.title = "";
      setStatus(statusEl.dataset.status);
      conn.textContent = source && source.readyState === 1 ? "live" : conn.textContent;
    }
    silent = s;
  }
  const agentUrl = script.dataset.agent;
  function askAgent() {
    if (ended || document.hidden) return;
    fetch(agentUrl, {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then(function (r) { if (!r.ok || r.redirected) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (body) {
        showSilence(body.silence);
        showReplicas(body.replicas || [], body.replicas_heading, body.replicas_throughput);
        if (body.rolling && body.rolling.text) showRolling(body.rolling);
      })
      .catch(function () { /* the page keeps what it shows; the next ask may answer */ });
  }
  // The Replicas table, live: each replica's moves go down its own stream and a lost host
  // sends nothing, so the page redraws the table from each ask (a replica whose host is
  // lost reads `unknown`), and asks at once when its own stream tells of a move.
  function cell(row, text, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    if (text instanceof Node) td.appendChild(text); else td.textContent = text;
    row.appendChild(td);
  }
  function showReplicas(rows, heading, throughput) {
    const section = document.getElementById("replicas");
    if (!section || !rows.length) return;
    let table = document.getElementById("replica-rows");
    if (!table) {
      table = document.createElement("table");
      table.className = "list";
      table.id = "replica-rows";
      const head = document.createElement("tr");
      ["Replica", "Host", "GPUs", "Status", "Run", "Throughput", "Placed because"].forEach(function (h) {
        const th = document.createElement("th");
        th.textContent = h;
        head.appendChild(th);
      });
      table.appendChild(document.createElement("thead")).appendChild(head);
      table.appendChild(document.createElement("tbody"));
      section.insertBefore(table, document.getElementById("scale-form"));
    }
    const body = table.tBodies[0];
    body.textContent = "";
    rows.forEach(function (r) {
      const tr = document.createElement("tr");
      tr.dataset.replica = r.index;
      const link = document.createElement("a");
      link.href = r.url;
      link.textContent = r.index + " (#" + r.id + ")";
      cell(tr, link);
      cell(tr, r.host || "–");
      cell(tr, (r.gpus || []).join(","));
      const badge = document.createElement("span");
      badge.className = "status status-" + r.status;
      badge.textContent = r.status;
      cell(tr, badge);
      cell(tr, String(r.run));
      cell(tr, r.throughput === null || r.throughput === undefined ? "–" : r.throughput.toFixed(1) + " tok/s");
      cell(tr, r.placement_reason || "", "muted");
      body.appendChild(tr);
    });
    let total = document.getElementById("replicas-throughput");
    if (!total) {
      total = document.createElement("p");
      total.id = "replicas-throughput";
      section.insertBefore(total, table);
    }
    total.textContent = heading + " · throughput " +
      (throughput === null || throughput === undefined ? "–" : throughput.toFixed(1) + " tok/s") +
      " (the ready replicas' latest decode figures, summed)";
  }
  let askSoon = null;
  function askAgentSoon() {
    if (askSoon) return;
    askSoon = setTimeout(function () { askSoon = null; askAgent(); }, 300);
  }
  showSilence(JSON.parse(document.getElementById("agent-silence").textContent));
  if (!summary.is_terminal) setInterval(askAgent, AGENT_ASK_MS);

  // The build and self-check cards show their steps: those rare events come in one request
  // (the newest 200 up to the tail), before the live stream, so they never overwrite it.
  // Bounded: a request the panel has not answered in CARDS_WAIT_MS is given up, and the page
  // goes live without those steps rather than not at all.
  const cardKinds = "build,selfcheck";
  const cards = new AbortController();
  const cardsBound = setTimeout(function () { cards.abort(); }, CARDS_WAIT_MS);
  fetch(script.dataset.history + "?kind=" + cardKinds + "&limit=200&before=" + (lastSeq + 1),
        {signal: cards.signal})
    .then(function (r) { return r.ok ? r.json() : {events: []}; })
    .then(function (page) { page.events.forEach(handle); })
    .catch(function () { /* the cards stay as the page drew them */ })
    .finally(function () { clearTimeout(cardsBound); follow(); });
})();
