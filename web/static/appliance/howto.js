// "How to call it" (detail page) follows the live status badge (detail.js sets its
// data-status): the examples while ready, the "callable once ready" line otherwise.
// Copy buttons (here and on the playground) copy the text of the element data-copy names.
(function () {
  "use strict";
  const badge = document.getElementById("status");
  const ready = document.getElementById("call-ready");
  const notReady = document.getElementById("call-not-ready");
  if (badge && ready && notReady) {
    const apply = function () {
      const isReady = badge.dataset.status === "ready";
      ready.hidden = !isReady;
      notReady.hidden = isReady;
    };
    new MutationObserver(apply).observe(badge, { attributes: true, attributeFilter: ["data-status"] });
    apply();
  }

  // navigator.clipboard exists only on https or localhost; a panel reached over plain http
  // on the LAN copies through a selection instead.
  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    const area = document.createElement("textarea");
    area.value = text;
    document.body.appendChild(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    return ok ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }
  document.addEventListener("click", function (ev) {
    const button = ev.target.closest("button.copy[data-copy]");
    if (!button) return;
    const source = document.getElementById(button.dataset.copy);
    copyText(source ? source.textContent : "").then(
      function () { button.textContent = "Copied"; },
      function () { button.textContent = "Select and copy by hand"; });
    setTimeout(function () { button.textContent = "Copy"; }, 2000);
  });
})();
