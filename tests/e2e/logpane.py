"""The detail page's log pane as the browser tests and bench/log_history.py time it."""

# The figures' targets (a detail page stays usable however long its log) are checked by
# bench/log_history.py, which times what these time.

# Resolves with the milliseconds from the action (run first) to the log pane's next DOM change.
TIMED = """async (action) => {
  const pane = document.getElementById("log");
  const changed = new Promise((done) => {
    new MutationObserver((m, observer) => { observer.disconnect(); done(); })
      .observe(pane, {childList: true});
  });
  const t0 = performance.now();
  (new Function(action))();
  await changed;
  return performance.now() - t0;
}"""
# Resolves with the milliseconds from the action to older lines inserted at the pane's top:
# a live line appended meanwhile (a serving engine's) is not the page that was asked for.
TIMED_OLDER = """async (action) => {
  const pane = document.getElementById("log");
  const first = pane.firstElementChild;
  const changed = new Promise((done) => {
    new MutationObserver((m, observer) => {
      if (pane.firstElementChild !== first) { observer.disconnect(); done(); }
    }).observe(pane, {childList: true});
  });
  const t0 = performance.now();
  (new Function(action))();
  await changed;
  return performance.now() - t0;
}"""
SCROLL_TOP = 'const p = document.getElementById("log"); p.scrollTop = 0;'
# The pane's filter by kind (phases), a text search, and back to every line.
FILTER_PHASES = ('const k = document.getElementById("log-kind"); k.value = "phase";'
                 ' k.dispatchEvent(new Event("change"));')
SEARCH = ('const f = document.getElementById("log-filter"); f.elements.kind.value = "";'
          ' f.elements.q.value = "kv cache usage"; f.requestSubmit();')
CLEAR = ('const f = document.getElementById("log-filter"); f.elements.kind.value = "";'
         ' f.elements.q.value = ""; f.requestSubmit();')
