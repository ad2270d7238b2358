// Losslessness check page: polls the check from the REST API; while it runs, each prompt's
// row appears as it is judged (progress.prompts), then the finished results replace them.
// Each row: verdict, the first divergent token's position, B's top-2 gap there, and both
// continuations side by side from that token, the divergent token itself marked.
(function () {
  "use strict";
  const script = document.currentScript;
  const api = script.dataset.api;
  const ACTIVE = ["queued", "running", "cancelling"];

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) { node.textContent = text; }
    if (cls) { node.className = cls; }
    return node;
  }

  // The continuation with its first token in a <mark class="divergent">: the token's own text
  // where B named it, else the first id.
  function continuation(side) {
    const td = el("td", null, "continuation");
    if (!side) { td.textContent = "–"; return td; }
    const text = side.text;
    const first = side.token_text;
    if (text !== null && text !== undefined && first && text.indexOf(first) === 0) {
      td.appendChild(el("mark", first, "divergent"));
      td.appendChild(el("span", text.slice(first.length), "rest"));
    } else {
      td.appendChild(el("mark", "[id " + (side.ids.length ? side.ids[0] : "?") + "]", "divergent"));
      td.appendChild(el("span", text === null || text === undefined ? "" : " " + text, "rest"));
    }
    // Ids from an engine's /generate; through the gateway (/v1) the tokens are their texts.
    const named = side.ids.length && typeof side.ids[0] === "string" ? "tokens " : "ids ";
    td.appendChild(el("div", named + JSON.stringify(side.ids), "muted ids"));
    return td;
  }

  function showRows(prompts) {
    const tbody = document.querySelector("#verify-table tbody");
    tbody.textContent = "";
    prompts.forEach(function (p) {
      const tr = el("tr", null, "verdict-" + p.verdict);
      tr.dataset.index = p.index;
      tr.dataset.verdict = p.verdict;
      tr.appendChild(el("td", p.index, "index"));
      tr.appendChild(el("td", p.prompt.length > 80 ? p.prompt.slice(0, 80) + "…" : p.prompt, "prompt"));
      tr.appendChild(el("td", p.verdict, "verdict"));
      tr.appendChild(el("td", p.position === null ? "–" : String(p.position), "position"));
      tr.appendChild(el("td", p.gap === null ? "–" : Number(p.gap).toFixed(4), "gap"));
      // A token outside B's top two: how far below B's top-1 it sat, where B gave it.
      if (p.candidate_in_top2 === false && p.candidate_gap !== null && p.candidate_gap !== undefined) {
        tr.lastChild.appendChild(el("div", "A's token " + Number(p.candidate_gap).toFixed(4) +
          " below", "muted candidate-gap"));
      }
      tr.appendChild(continuation(p.a));
      tr.appendChild(continuation(p.b));
      tbody.appendChild(tr);
    });
  }

  function showSummary(run) {
    const r = run.results && run.results.total !== undefined ? run.results : null;
    const p = run.progress || {};
    const total = r ? r.total : (p.done || 0);
    const identical = r ? r.identical : (p.identical || 0);
    document.getElementById("match-rate").textContent = total
      ? identical + "/" + total + " (" + (100 * identical / total).toFixed(1) + " %)" : "–";
    document.getElementById("near-ties").textContent = r ? r.near_ties : (p.near_ties || 0);
    document.getElementById("failures").textContent = r ? r.failures : (p.failures || 0);
    document.getElementById("verify-verdict").textContent = r
      ? (r.passed ? "passed" : "failed") : (run.status === "done" ? "passed" : run.status);
    // What was compared (token ids, token texts, or A's tokens read from its text where its
    // engine build refuses log-probs) and why: the result's own words.
    const compared = document.getElementById("verify-compared");
    compared.hidden = !r;
    compared.textContent = r ? ["Compared: " + r.compared + "."].concat(r.notes || []).join(" ") : "";
  }

  function showProgress(run) {
    const p = run.progress || {};
    const bar = document.getElementById("verify-progress");
    bar.value = run.status === "done" ? 1 : (p.total ? (p.done || 0) / p.total : 0);
    document.getElementById("verify-progress-text").textContent = run.status === "done"
      ? "done: " + (p.total || 0) + " prompts" : (p.done || 0) + "/" + (p.total || "?") + " prompts";
    document.getElementById("verify-status").textContent = run.status;
    const err = document.getElementById("verify-error");
    err.hidden = !run.error;
    err.textContent = run.error ? run.error.trim().split("\n").slice(-3).join(" ") : "";
  }

  function poll() {
    fetch(api, {headers: {Accept: "application/json"}, credentials: "same-origin"})
      .then(function (r) { return r.json(); })
      .then(function (run) {
        showProgress(run);
        showSummary(run);
        const rows = (run.results && run.results.prompts) || (run.progress && run.progress.prompts) || [];
        showRows(rows);
        if (ACTIVE.indexOf(run.status) >= 0) { setTimeout(poll, 1000); }
        const cancel = document.getElementById("cancel-form");
        if (cancel && ACTIVE.indexOf(run.status) < 0) { cancel.remove(); }
      })
      .catch(function () { setTimeout(poll, 3000); });
  }
  poll();
}());
