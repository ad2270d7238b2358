// The deployments list refreshes itself: every data-refresh-s seconds (while the tab is
// visible) it asks data-src for the rows (one query on the server, however many rows) and
// redraws them from the same texts the server rendered (web/deployments/listing.py).
(function () {
  "use strict";
  const table = document.getElementById("deployment-rows");
  if (!table) return;
  const every = Math.max(Number(table.dataset.refreshS) || 5, 1) * 1000;
  const note = document.getElementById("list-refreshed");
  const state = {refreshes: 0, failures: 0};

  function detailUrl(id) { return table.dataset.detail.replace("/0/", "/" + id + "/"); }

  function cell(tr, text, className, title) {
    const td = tr.insertCell();
    if (className) td.className = className;
    if (title) td.title = title;
    if (text instanceof Node) td.appendChild(text); else td.textContent = text;
    return td;
  }

  function link(id, text) {
    const a = document.createElement("a");
    a.href = detailUrl(id);
    a.textContent = text;
    return a;
  }

  function tag(name, text, className) {
    const el = document.createElement(name);
    el.textContent = text;
    if (className) el.className = className;
    return el;
  }

  function row(d) {
    const tr = document.createElement("tr");
    tr.id = "deployment-" + d.id;
    cell(tr, link(d.id, "#" + d.id), "id");
    cell(tr, link(d.id, d.name));
    const status = cell(tr, tag("span", d.status, "status status-" + d.status), "", d.silent);
    if (d.silent) {  // its agent is silent: the alert the server renders too (list.html)
      status.appendChild(document.createTextNode(" "));
      status.appendChild(tag("small", "agent silent", "alert-note"));
    }
    if (d.replicas) {  // "3 replicas (2 ready)": its replica rows are not rows here
      status.appendChild(document.createTextNode(" "));
      status.appendChild(tag("small", d.replicas, "replicas"));
    }
    cell(tr, d.uptime, "uptime", d.ready_since ? "ready since " + d.ready_since : "");
    cell(tr, d.throughput, "throughput",
      d.throughput_at ? "output tokens, from the metric point of " + d.throughput_at : "");
    const endpoint = cell(tr, d.endpoint ? tag("code", d.endpoint) : "–", "endpoint");
    if (d.endpoint) {  // the gateway's URL and the model clients name (list.html too)
      const model = tag("small", "model ");
      model.appendChild(tag("code", d.model));
      endpoint.appendChild(document.createTextNode(" "));
      endpoint.appendChild(model);
    }
    cell(tr, d.algorithm);
    cell(tr, d.recipe);
    cell(tr, d.gpus);
    const time = tag("time", d.created);
    time.dateTime = d.created_iso;
    cell(tr, time);
    return tr;
  }

  function empty() {
    const tr = document.createElement("tr");
    cell(tr, "No deployments yet.", "muted").colSpan = 10;
    return tr;
  }

  function show(body) {
    const rows = body.deployments || [];
    const tbody = document.createElement("tbody");
    (rows.length ? rows.map(row) : [empty()]).forEach(function (tr) { tbody.appendChild(tr); });
    table.replaceChild(tbody, table.tBodies[0]);
    state.refreshes += 1;
    note.textContent = "refreshed " + new Date().toISOString().slice(11, 19) + " UTC";
  }

  function refresh() {
    if (document.hidden) return;
    fetch(table.dataset.src, {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then(function (r) {
        if (r.redirected) throw new Error("logged out");  // to the login page
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(show)
      .catch(function (err) {
        // Say so rather than go quiet: the rows on the page are getting old.
        state.failures += 1;
        note.textContent = "could not refresh (" + err.message + "); reload the page";
      });
  }

  setInterval(refresh, every);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) refresh(); });
  window.ApplianceList = {refresh: refresh, stats: function () { return Object.assign({}, state); }};
})();
