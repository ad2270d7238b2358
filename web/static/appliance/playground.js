// Playground: a multi-turn chat with one deployment through the gateway's own URL
// (POST <base>/chat/completions, streamed), the panel session standing in for an API key.
// Each answer shows its TTFT, output tokens/s and accept length, each saying where it came
// from; the request is shown as curl with the key elided. The history lives in this page.
(function () {
  "use strict";
  const script = document.currentScript;
  const model = script.dataset.model;
  const baseUrl = script.dataset.baseUrl;
  const keyVar = script.dataset.keyVar;
  const speculative = script.dataset.speculative === "1";
  // Same origin as the page: the session cookie is the credential, the CSRF token its proof.
  const chatPath = new URL(baseUrl, location.href).pathname.replace(/\/$/, "") + "/chat/completions";
  const $ = function (id) { return document.getElementById(id); };
  const form = $("pg-form"), chat = $("pg-chat"), errorBox = $("pg-error");
  const history = [];  // {role, content} of the finished turns, sent again with each message
  let controller = null;

  // ---------------------------------------------------------------- the request
  function params() {
    const temperature = Number($("pg-temperature").value);
    const maxTokens = Number($("pg-max-tokens").value);
    const limit = Number($("pg-max-tokens").max);
    if ($("pg-temperature").value === "" || !(temperature >= 0 && temperature <= 2)) {
      return {error: "Temperature must be a number from 0 to 2 (0 is greedy)."};
    }
    if (!Number.isInteger(maxTokens) || maxTokens < 1 || maxTokens > limit) {
      return {error: "Max tokens must be a whole number from 1 to " + limit + "."};
    }
    return {temperature: temperature, max_tokens: maxTokens};
  }

  function requestBody(userText, p) {
    const messages = [];
    const system = $("pg-system").value.trim();
    if (system) messages.push({role: "system", content: system});
    history.forEach(function (m) { messages.push(m); });
    messages.push({role: "user", content: userText});
    // include_usage: the engine's own token count arrives in the last chunk.
    return {model: model, messages: messages, temperature: p.temperature,
      max_tokens: p.max_tokens, stream: true, stream_options: {include_usage: true}};
  }

  function shellQuote(s) { return "'" + s.replace(/'/g, "'\\''") + "'"; }
  function showCurl(body, note) {
    $("pg-curl").textContent = "curl -N " + shellQuote(baseUrl + "/chat/completions") + " \\\n" +
      '  -H "Authorization: Bearer $' + keyVar + '" \\\n' +
      '  -H "Content-Type: application/json" \\\n' +
      "  -d " + shellQuote(JSON.stringify(body));
    $("pg-curl-note").textContent = note;
  }
  function previewCurl() {
    const p = params();
    if (p.error) return;
    showCurl(requestBody($("pg-message").value || "…", p), "the next message's request");
  }

  // ---------------------------------------------------------------- the page
  function addTurn(role, text) {
    $("pg-empty").hidden = true;
    const li = document.createElement("li");
    li.className = "turn " + (role === "user" ? "question" : "answer");
    const who = document.createElement("b");
    who.textContent = role === "user" ? "you" : model;
    li.appendChild(who);
    const reasoning = document.createElement("div");
    reasoning.className = "reasoning";
    reasoning.hidden = true;
    li.appendChild(reasoning);
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    li.appendChild(body);
    chat.appendChild(li);
    return li;
  }

  function stat(li, cls, label, value, source) {
    let stats = li.querySelector(".turn-stats");
    if (!stats) {
      stats = document.createElement("p");
      stats.className = "turn-stats muted";
      li.appendChild(stats);
    }
    let span = stats.querySelector("." + cls);
    if (!span) {
      span = document.createElement("span");
      span.className = cls;
      stats.appendChild(span);
    }
    span.dataset.value = value === null ? "" : String(value);
    span.textContent = label + " " + (value === null ? "–" : value) + (source ? " (" + source + ")" : "");
  }

  function showError(text) {
    errorBox.textContent = text;
    errorBox.hidden = !text;
  }

  // A gateway error is OpenAI-shaped ({"error": {"message"}}); anything else (an HTML page,
  // an empty body) is reported by its status alone, never pasted in.
  const MEANING = {400: "bad request", 401: "not signed in", 403: "not allowed",
    404: "unknown model", 413: "request too large", 429: "rate limited",
    502: "engine unreachable", 503: "not ready", 504: "engine timed out"};
  function errorText(status, statusText, bodyText, retryAfter) {
    let message = "";
    try {
      const j = JSON.parse(bodyText);
      message = (j.error && (j.error.message || j.error)) || j.detail || j.message || "";
    } catch (e) { message = ""; }
    if (typeof message !== "string") message = "";
    return "The gateway answered " + status + " (" + (MEANING[status] || statusText || "error") + ")" +
      (message ? ": " + message.slice(0, 500) : ".") +
      (retryAfter ? " Try again in " + retryAfter + " s." : "");
  }

  // ---------------------------------------------------------------- the stream
  // One SSE event's data: text pieces, the usage chunk, an engine's meta info, an error.
  function readEvent(raw, state) {
    raw.split("\n").forEach(function (line) {
      if (line.indexOf("data:") !== 0) return;
      const data = line.slice(5).trim();
      if (!data || data === "[DONE]") return;
      let obj;
      try { obj = JSON.parse(data); } catch (e) { return; }
      if (obj.error) { state.error = obj.error.message || String(obj.error); return; }
      if (obj.usage) state.usage = obj.usage;
      if (obj.meta_info) state.meta = obj.meta_info;
      const choice = (obj.choices || [])[0];
      if (!choice) return;
      if (choice.meta_info) state.meta = choice.meta_info;
      const delta = choice.delta || {};
      const piece = (delta.content || "") + (delta.reasoning_content || "");
      if (piece) {
        const now = performance.now();
        if (state.first === null) state.first = now;
        state.last = now;
        state.chunks += 1;
        state.text += delta.content || "";
        state.reasoning += delta.reasoning_content || "";
        state.onText(state);
      }
      if (choice.finish_reason) state.finish = choice.finish_reason;
    });
  }

  async function stream(resp, state) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const part = await reader.read();
      if (part.done) break;
      buffer += decoder.decode(part.value, {stream: true}).replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        readEvent(buffer.slice(0, end), state);
        buffer = buffer.slice(end + 2);
      }
    }
    if (buffer.trim()) readEvent(buffer, state);
  }

  // ---------------------------------------------------------------- the figures
  function showSpeed(li, state, sentAt) {
    stat(li, "ttft", "TTFT", state.first === null ? null : Math.round(state.first - sentAt) + " ms", "");
    const fromUsage = state.usage && typeof state.usage.completion_tokens === "number";
    const tokens = fromUsage ? state.usage.completion_tokens : state.chunks;
    const span = state.last !== null && state.first !== null ? (state.last - state.first) / 1000 : 0;
    // Decode speed: the tokens after the first over the time after the first (TTFT apart).
    const rate = tokens > 1 && span > 0 ? ((tokens - 1) / span).toFixed(1) : null;
    stat(li, "tps", "output", rate === null ? null : rate + " tokens/s", tokens + " tokens, " +
      (fromUsage ? "the engine's usage" : "counted as streamed chunks: the stream had no usage"));
  }

  function fixed(v) { return typeof v === "number" && isFinite(v) ? v.toFixed(2) : null; }
  function metaAccept(meta) {
    if (typeof meta.spec_accept_length === "number") return meta.spec_accept_length;
    if (meta.spec_verify_ct > 0) return meta.completion_tokens / meta.spec_verify_ct;
    return null;
  }

  // From the response's meta info where the engine gives one; SGLang's OpenAI routes give
  // none, so then the deployment's latest decode stats (its /metrics, else its decode log
  // line), which cover all its traffic, not this answer alone: the label says which.
  function showAccept(li, state) {
    const fromMeta = state.meta ? fixed(metaAccept(state.meta)) : null;
    if (fromMeta !== null) { stat(li, "accept", "accept length", fromMeta, "this answer's meta info"); return; }
    if (!speculative) { stat(li, "accept", "accept length", "1.00", "no speculation"); return; }
    stat(li, "accept", "accept length", null, "reading the deployment's decode stats");
    fetch(script.dataset.summary, {headers: {Accept: "application/json"}, credentials: "same-origin"})
      .then(function (r) { if (!r.ok) throw new Error(String(r.status)); return r.json(); })
      .then(function (s) {
        const point = s.metrics || {}, decode = s.decode_stats || {};
        if (fixed(point.accept_len) !== null) {
          const when = new Date(point.t * 1000).toISOString().slice(11, 19);
          stat(li, "accept", "accept length", fixed(point.accept_len),
            "the deployment's latest decode stats: /metrics at " + when + " UTC, all its requests");
        } else if (fixed(decode.accept_len) !== null) {
          stat(li, "accept", "accept length", fixed(decode.accept_len),
            "the deployment's latest decode stats: its last decode log line");
        } else {
          stat(li, "accept", "accept length", null, "no decode stats yet");
        }
      })
      .catch(function (e) { stat(li, "accept", "accept length", null, "decode stats unreadable: " + e.message); });
  }

  // ---------------------------------------------------------------- one message
  async function send(userText, p) {
    const body = requestBody(userText, p);
    showCurl(body, "the last message's request");
    showError("");
    const question = addTurn("user", userText);
    const li = addTurn("assistant", "");
    const textEl = li.querySelector(".text"), reasoningEl = li.querySelector(".reasoning");
    const state = {first: null, last: null, chunks: 0, text: "", reasoning: "", usage: null,
      meta: null, finish: null, error: null,
      onText: function (s) {
        textEl.textContent = s.text;
        reasoningEl.textContent = s.reasoning;
        reasoningEl.hidden = !s.reasoning;
      }};
    controller = new AbortController();
    busy(true);
    const sentAt = performance.now();
    let stopped = false;
    try {
      const resp = await fetch(chatPath, {method: "POST", credentials: "same-origin",
        headers: {"Content-Type": "application/json", Accept: "text/event-stream",
          "X-CSRFToken": script.dataset.csrf},
        body: JSON.stringify(body), signal: controller.signal});
      if (!resp.ok) {
        const text = await resp.text();
        throw new Error(errorText(resp.status, resp.statusText, text, resp.headers.get("Retry-After")));
      }
      await stream(resp, state);
    } catch (e) {
      stopped = e.name === "AbortError";
      if (!stopped) {
        const text = e instanceof TypeError ? "The gateway could not be reached (" + e.message + ")." : e.message;
        showError(text);
        li.classList.add("failed");
        textEl.textContent = state.text || "no answer";
        question.classList.add("failed");
        busy(false);
        return;  // neither turn joins the history: the next message is asked afresh
      }
    }
    busy(false);
    if (state.error) { showError("The engine stopped the answer: " + state.error); li.classList.add("failed"); }
    if (stopped) li.classList.add("stopped");
    history.push({role: "user", content: userText});
    history.push({role: "assistant", content: state.text});
    showSpeed(li, state, sentAt);
    showAccept(li, state);
    if (state.finish) stat(li, "finish", "finished:", state.finish, "");
    else if (stopped) stat(li, "finish", "finished:", "stopped", "by you");
  }

  function busy(on) {
    $("pg-send").disabled = on;
    $("pg-clear").disabled = on;
    $("pg-stop").hidden = !on;
    if (!on) controller = null;
  }

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    const p = params();
    const text = $("pg-message").value.trim();
    const err = $("pg-input-error");
    err.textContent = p.error || (text ? "" : "Message: write something to send.");
    err.hidden = !err.textContent;
    if (err.textContent) return;
    $("pg-message").value = "";
    send(text, p);
  });
  $("pg-message").addEventListener("keydown", function (ev) {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) form.requestSubmit();
  });
  $("pg-stop").addEventListener("click", function () { if (controller) controller.abort(); });
  $("pg-clear").addEventListener("click", function () {
    history.length = 0;
    chat.textContent = "";
    $("pg-empty").hidden = false;
    showError("");
    previewCurl();
  });
  ["pg-system", "pg-temperature", "pg-max-tokens", "pg-message"].forEach(function (id) {
    $(id).addEventListener("input", previewCurl);
  });
  previewCurl();
  window.AppliancePlayground = {history: function () { return history.slice(); }};
})();
