// The detail page's log pane: opens at the tail the page carries, goes on live, and pages
// older (or, after a scroll back, newer) lines in from the history endpoint on demand;
// a kind filter and a text search ask the server, a page at a time. The pane never holds
// more than CAP lines: live lines push the oldest out, a scroll back pushes the newest out
// (the pane then leaves the live tail until it is scrolled down again or "latest" clicked).
(function () {
  "use strict";
  const CAP = 2000;  // lines in the DOM at most
  const PAGE = 200;  // lines per history request
  const EDGE_PX = 300;  // this near an end, the next page is asked for
  const BUFFER = 1000;  // live events kept while the pane is away from the tail

  const state = {
    pane: null, url: "", autoscroll: null, note: null, latest: null,
    kinds: "", q: "",
    olderBefore: null,  // `before` of the next older page; null: the start is shown
    newestSeq: 0,  // the newest seq shown (or skipped past)
    attached: true,  // the pane ends at the live tail
    buffered: [],  // live events that came while detached
    loading: null,  // the request in flight (one at a time)
    generation: 0,  // bumped by a filter change: an answer for an older query is dropped
    fetches: 0,
  };

  // ------------------------------------------------------------ a line from an event

  // The self-check's stream lines ("gpu-check: {json}") are data for the self-check card;
  // in the log they become one short line each, or nothing.
  const checkPrefix = "gpu-check: {";
  function selfcheckLine(text) {
    let e;
    try {
      e = JSON.parse(text.slice(text.indexOf(checkPrefix) + checkPrefix.length - 1));
    } catch (err) {
      return text;  // not the stream's JSON after all: show it as it came
    }
    switch (e.event) {
      case "check": return "self-check: " + e.id + " " + (e.ok ? "ok" : "FAILED: " + (e.message || ""));
      case "report": return "self-check: " + (e.ok ? "passed" : "FAILED") + " in " + e.elapsed_s + " s";
      default: return null;  // begin, gpus, ...: the card has them
    }
  }

  // [text, class] of an event's line, or null when it is no line of the log.
  function lineOf(event) {
    const p = event.payload || {};
    switch (event.kind) {
      case "log": {
        let text = p.text;
        if (typeof text === "string" && text.indexOf(checkPrefix) >= 0) text = selfcheckLine(text);
        if (text === null || text === undefined) return null;
        return [text, p.stream === "stderr" ? "stderr" : ""];
      }
      case "build":
        if (p.kind === "build_step") return ["build step " + p.step + "/" + p.total + ": " + (p.text || ""), "build"];
        if (p.kind === "cache_hit" || p.kind === "built" || p.kind === "build_log" || p.kind === "handed_over") return [p.text || "", "build"];
        return null;
      case "phase": return ["── " + p.status + (p.message ? ": " + p.message : ""), "marker"];
      case "status": return ["── " + (p.message || ""), "marker"];
      case "diagnosis": return ["── diagnosis " + (p.cause || "") + ": " + (p.summary || ""), "marker"];
      case "alert": return ["── alert " + p.id + " " + p.state + ": " + (p.summary || ""), "marker"];
      // The stream fell too far behind (a background tab) and went on near the head.
      case "skip": return ["── skipped " + p.skipped + " lines, from seq " + p.from + " to " + p.to + "; ", "marker skip"];
      default: return null;
    }
  }

  function matches(event, line) {
    if (state.kinds && state.kinds.split(",").indexOf(event.kind) < 0) return false;
    return !state.q || line[0].toLowerCase().indexOf(state.q.toLowerCase()) >= 0;
  }

  function fragmentOf(events) {
    const fragment = document.createDocumentFragment();
    events.forEach(function (event) {
      const line = lineOf(event);
      if (line === null) return;
      const span = document.createElement("span");
      span.className = line[1] ? "line " + line[1] : "line";
      span.dataset.seq = event.seq;
      span.textContent = line[0];
      if (event.kind === "skip") span.appendChild(reloadLink());
      span.appendChild(document.createTextNode("\n"));
      fragment.appendChild(span);
    });
    return fragment;
  }

  // A skip line's way to the lines it skipped: the newest page, from the history view.
  function reloadLink() {
    const link = document.createElement("a");
    link.href = "#";
    link.className = "reload-history";
    link.textContent = "reload history";
    link.addEventListener("click", function (e) { e.preventDefault(); loadLatest(); });
    return link;
  }

  // ------------------------------------------------------------ the pane's ends

  function firstSeq() {
    const first = state.pane.firstElementChild;
    return first ? Number(first.dataset.seq) : null;
  }

  function trimTop() {
    const pane = state.pane;
    let removed = false;
    while (pane.childElementCount > CAP) { pane.firstElementChild.remove(); removed = true; }
    if (removed) state.olderBefore = firstSeq();
  }

  function trimBottom() {
    const pane = state.pane;
    let removed = false;
    while (pane.childElementCount > CAP) { pane.lastElementChild.remove(); removed = true; }
    if (removed) {
      const last = pane.lastElementChild;
      state.newestSeq = last ? Number(last.dataset.seq) : state.newestSeq;
      detach();
    }
  }

  function detach() {
    state.attached = false;
    state.autoscroll.checked = false;
    state.latest.hidden = false;
  }

  function attach() {
    state.attached = true;
    state.latest.hidden = true;
    const pending = state.buffered.filter(function (e) { return e.seq > state.newestSeq; });
    state.buffered = [];
    pending.forEach(live);
  }

  function query(extra) {
    const params = new URLSearchParams(extra);
    params.set("limit", PAGE);
    if (state.kinds) params.set("kind", state.kinds);
    if (state.q) params.set("q", state.q);
    return state.url + "?" + params.toString();
  }

  // One history request at a time; resolves once its lines are in the DOM (or dropped).
  function request(extra, apply) {
    if (state.loading) return state.loading;
    const generation = state.generation;
    state.fetches += 1;
    const loading = fetch(query(extra), {headers: {Accept: "application/json"}})
      .then(function (r) {
        if (!r.ok) throw new Error("history request failed: HTTP " + r.status);
        return r.json();
      })
      .then(function (page) { if (generation === state.generation) apply(page); })
      .catch(function (err) { state.note.textContent = String(err.message || err); })
      .finally(function () { if (state.loading === loading) state.loading = null; });
    state.loading = loading;
    return loading;
  }

  function loadOlder() {
    if (state.olderBefore === null) return Promise.resolve();
    return request({before: state.olderBefore}, function (page) {
      const pane = state.pane;
      const height = pane.scrollHeight;
      pane.insertBefore(fragmentOf(page.events), pane.firstChild);
      pane.scrollTop += pane.scrollHeight - height;  // the lines in view stay in view
      state.olderBefore = page.next_before;
      trimBottom();
      showReach(page);
    });
  }

  function loadNewer() {
    if (state.attached) return Promise.resolve();
    return request({after: state.newestSeq}, function (page) {
      state.pane.appendChild(fragmentOf(page.events));
      if (page.events.length) state.newestSeq = page.events[page.events.length - 1].seq;
      trimTop();
      if (page.next_after === null) attach();
    });
  }

  // The newest page of the current query replaces the pane (one DOM change).
  function loadLatest() {
    state.generation += 1;
    state.loading = null;
    return request({}, function (page) {
      state.pane.replaceChildren(fragmentOf(page.events));
      state.olderBefore = page.next_before;
      const events = page.events;
      if (events.length) state.newestSeq = Math.max(state.newestSeq, events[events.length - 1].seq);
      state.buffered = [];
      state.attached = true;
      state.latest.hidden = true;
      state.autoscroll.checked = true;
      state.pane.scrollTop = state.pane.scrollHeight;
      showReach(page);
    });
  }

  function showReach(page) {
    if (!state.q) { state.note.textContent = ""; return; }
    state.note.textContent = page.next_before === null ? "searched the whole log"
      : "searched back to #" + page.next_before + "; scroll up for older matches";
  }

  // A search reads a window of the log per request: while the pane is not full enough to
  // scroll, the next window is asked for at once.
  function onScroll() {
    const pane = state.pane;
    const fromBottom = pane.scrollHeight - pane.scrollTop - pane.clientHeight;
    if (state.attached) state.autoscroll.checked = fromBottom < 4;
    if (pane.scrollTop < EDGE_PX && state.olderBefore !== null) {
      loadOlder().then(fillIfShort);
    } else if (fromBottom < EDGE_PX && !state.attached) {
      loadNewer();
    }
  }

  function fillIfShort() {
    if (state.pane.scrollHeight <= state.pane.clientHeight + EDGE_PX && state.olderBefore !== null) {
      loadOlder().then(fillIfShort);
    }
  }

  // ------------------------------------------------------------ live lines

  function live(event) {
    if (event.seq <= state.newestSeq) return;
    if (!state.attached) {
      state.buffered.push(event);
      if (state.buffered.length > BUFFER) state.buffered.shift();
      return;
    }
    state.newestSeq = event.seq;
    const line = lineOf(event);
    if (line === null || (event.kind !== "skip" && !matches(event, line))) return;
    state.pane.appendChild(fragmentOf([event]));
    trimTop();
    if (state.autoscroll.checked) state.pane.scrollTop = state.pane.scrollHeight;
  }

  function setFilter(kinds, q) {
    state.kinds = kinds || "";
    state.q = q || "";
    return loadLatest().then(fillIfShort);
  }

  function init(options) {
    Object.assign(state, {
      pane: options.pane, url: options.url, autoscroll: options.autoscroll,
      note: options.note, latest: options.latest,
    });
    const tail = options.tail || [];
    state.pane.replaceChildren(fragmentOf(tail));
    state.newestSeq = options.lastSeq || 0;
    state.olderBefore = tail.length ? tail[0].seq : null;
    state.pane.scrollTop = state.pane.scrollHeight;
    performance.mark("log-tail");
    state.pane.addEventListener("scroll", onScroll, {passive: true});
    state.latest.addEventListener("click", function () { loadLatest(); });
    if (options.form) {
      options.form.addEventListener("submit", function (e) {
        e.preventDefault();
        setFilter(options.form.elements.kind.value, options.form.elements.q.value);
      });
      options.form.elements.kind.addEventListener("change", function () {
        setFilter(options.form.elements.kind.value, options.form.elements.q.value);
      });
    }
  }

  function stats() {
    return {lines: state.pane.childElementCount, first: firstSeq(), newest: state.newestSeq,
      attached: state.attached, olderBefore: state.olderBefore, fetches: state.fetches};
  }

  window.ApplianceLog = {init: init, live: live, setFilter: setFilter, loadOlder: loadOlder,
    stats: stats, CAP: CAP, PAGE: PAGE};
})();
