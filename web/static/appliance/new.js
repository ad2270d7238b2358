// New-deployment page: choosing a recipe fills the algorithm and its engine defaults, the
// same values the server renders for ?recipe=NAME, so the form never shows a recipe beside
// an algorithm its engine lacks.
(function () {
  "use strict";
  const defaults = JSON.parse(document.getElementById("recipe-defaults").textContent);
  const recipe = document.getElementById("id_recipe");

  function fill(values) {
    Object.keys(values).forEach(function (name) {
      const input = document.getElementById("id_" + name);
      // null means the recipe sets nothing: blank, so the engine's own default applies.
      if (input) input.value = values[name] === null ? "" : String(values[name]);
    });
  }

  recipe.addEventListener("change", function () {
    // A recipe that did not load has no entry: leave the fields; deploying says what is wrong.
    if (defaults[recipe.value]) fill(defaults[recipe.value]);
  });

  // The chosen model's expected weight-load time (its size over its root's measured read
  // rate, as pre-flight's load-time finding says), by store entry or by a path the store lists.
  const storeModels = JSON.parse(document.getElementById("store-models").textContent) || [];
  function estimate(entryName, pathName) {
    const entry = document.getElementById("id_" + entryName);
    const path = document.getElementById("id_" + pathName);
    const out = document.getElementById("estimate-" + pathName);
    if (!path || !out) return;
    function show() {
      const chosen = storeModels.find(function (m) {
        return entry && entry.value ? String(m.id) === entry.value : m.path === path.value.replace(/\/+$/, "");
      });
      out.textContent = chosen ? "Expected load: " + chosen.estimate + " (" + chosen.state + ")" : "";
    }
    if (entry) entry.addEventListener("change", show);
    path.addEventListener("input", show);
    show();
  }
  estimate("model_entry", "model_path");
  estimate("drafter_entry", "drafter_path");
})();
