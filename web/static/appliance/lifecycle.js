// Detail page: the lifecycle buttons follow the live status badge (detail.js sets its
// data-status): Stop while active, Restart and Delete once stopped or failed.
(function () {
  "use strict";
  const badge = document.getElementById("status");
  if (!badge) return;
  function apply() {
    const terminal = badge.dataset.status === "stopped" || badge.dataset.status === "failed";
    document.querySelectorAll("#actions [data-when]").forEach(function (el) {
      el.hidden = (el.dataset.when === "terminal") !== terminal;
    });
  }
  new MutationObserver(apply).observe(badge, { attributes: true, attributeFilter: ["data-status"] });
  apply();
})();
