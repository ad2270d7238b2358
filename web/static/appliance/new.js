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
})();
