// A store entry's page: its live progress from the entry's event stream (web/store/sse.py).
(function () {
  "use strict";
  const script = document.currentScript;
  const $ = (id) => document.getElementById(id);
  const TERMINAL = ["ready", "partial", "failed", "cancelled"];

  function size(n) {
    if (n >= 1e9) return (n / 1e9).toFixed(2) + " GB";
    if (n >= 1e6) return (n / 1e6).toFixed(1) + " MB";
    if (n >= 1e3) return (n / 1e3).toFixed(1) + " kB";
    return n + " bytes";
  }

  function fileRow(file) {
    const body = $("files").tBodies[0];
    let row = body.querySelector(`tr[data-path="${CSS.escape(file.path)}"]`);
    if (!row) {
      row = body.insertRow();
      row.dataset.path = file.path;
      ["", "", "done", "state", "sha muted"].forEach((c) => { row.insertCell().className = c; });
      row.cells[0].textContent = file.path;
    }
    return row;
  }

  function show(entry) {
    $("entry-state").textContent = entry.state;
    $("entry-state").className = "status status-" + entry.state;
    $("bytes-done").textContent = size(entry.bytes_done);
    $("bytes-total").textContent = size(entry.size_bytes);
    $("rate").textContent = entry.waiting ? "waiting for a worker"
      : entry.rate_bps > 0 ? size(entry.rate_bps) + "/s" : "–";
    $("eta").textContent = entry.seconds_left != null ? Math.ceil(entry.seconds_left) + " s left" : "–";
    $("entry-error").textContent = entry.error || "";
    $("config").textContent = JSON.stringify(entry.config);
    $("usable").textContent = entry.usable ? "usable by engines" : "not usable until verified";
    $("bar").max = entry.size_bytes || 1;
    $("bar").value = entry.bytes_done;
    for (const file of entry.files || []) {
      const row = fileRow(file);
      row.cells[1].textContent = file.size_bytes;
      row.cells[2].textContent = file.bytes_done;
      row.cells[3].textContent = file.state;
      row.cells[4].textContent = file.sha256_actual || file.sha256_expected || "(git blob id)";
    }
    const cancel = $("cancel-form");
    if (cancel && TERMINAL.includes(entry.state)) cancel.remove();
  }

  const source = new EventSource(script.dataset.events);
  source.addEventListener("progress", (e) => {
    const entry = JSON.parse(e.data);
    show(entry);
    if (TERMINAL.includes(entry.state)) source.close();
  });
})();
