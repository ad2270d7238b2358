// The models list: while a download runs, its row's progress and state follow the REST API
// (every 2 s); the page reloads once none is active, so rows show what verification found.
(function () {
  "use strict";
  const api = document.currentScript.dataset.api;
  const TERMINAL = ["ready", "partial", "failed", "cancelled"];

  function size(n) {
    if (n >= 1e9) return (n / 1e9).toFixed(2) + " GB";
    if (n >= 1e6) return (n / 1e6).toFixed(1) + " MB";
    if (n >= 1e3) return (n / 1e3).toFixed(1) + " kB";
    return n + " bytes";
  }

  function progress(e) {
    const rate = e.rate_bps > 0 ? ` · ${size(e.rate_bps)}/s` : "";
    const left = e.seconds_left != null ? ` · ${Math.ceil(e.seconds_left)} s left` : "";
    return `${size(e.bytes_done)} of ${size(e.size_bytes)}${rate}${left}`;
  }

  async function poll() {
    if (!document.querySelector("td.progress[data-active]")) return;
    let entries = [];
    try {
      const answer = await fetch(api, { credentials: "same-origin" });
      entries = (await answer.json()).results || [];
    } catch (err) {
      setTimeout(poll, 5000);  // the panel restarting: try again
      return;
    }
    let ended = false;
    for (const e of entries) {
      const row = document.getElementById("model-" + e.id);
      const cell = row && row.querySelector("td.progress[data-active]");
      if (!cell) continue;
      cell.textContent = progress(e);
      const state = row.querySelector(".status");
      state.textContent = e.state;
      state.className = "status status-" + e.state;
      if (TERMINAL.includes(e.state)) ended = true;
    }
    if (ended) window.location.reload();
    else setTimeout(poll, 2000);
  }

  setTimeout(poll, 2000);
})();
