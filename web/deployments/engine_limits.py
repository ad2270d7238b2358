"""What a deployment's engine refuses, for its page: a property of its engine build (the
SGLang source or release its recipe pins, built by its lock into its image), read from
appliance.engine.refusals, with where that knowledge comes from (a recording or a source
reading) and what the gateway does with such a request (its companion, or a 400)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from appliance.engine.recipes import RecipeError, load_site_recipe
from appliance.engine.refusals import (
    GRAMMAR_WHAT,
    LOGPROBS_WHAT,
    assumed_needs,
    build_refusals,
)

from .models import Deployment


def engine_limits(*, deployment: Deployment) -> dict[str, Any]:
    """The engine build and what it refuses under the deployment's algorithm.

    Keys: `source` (the build key, "" unknown), `title`, `recipe`, `lock`, `image`,
    `algorithm`, `known` (the table has this build and mode), `basis` and `evidence`,
    `refuses` (list of {what, message}), `serves` (the needs it is known to serve),
    `companion` (the spec's), and `text` (one sentence a person reads)."""
    try:
        recipe = load_site_recipe(deployment.recipe, settings.RECIPES_DIR)
        source, lock = recipe.source_key or "", recipe.lock or ""
    except (RecipeError, OSError, ValueError):
        source, lock = "", ""
    algorithm = (deployment.algorithm or "NONE").upper()
    build = build_refusals(source)
    needs = build.needs(algorithm) if build is not None else None
    known = needs is not None
    if needs is None:
        needs = assumed_needs(algorithm)
    refuses = [{"need": need, "what": what, "message": message}
               for need, (what, message) in needs.items()]
    spec = deployment.spec if isinstance(deployment.spec, dict) else {}
    companion = str(spec.get("companion") or "")
    served = [what for what in (LOGPROBS_WHAT, GRAMMAR_WHAT)
              if what not in {r["what"] for r in refuses}]
    title = build.title if build is not None else (f"SGLang {source}" if source else
                                                   "an engine build not recorded")
    return {"source": source, "title": title, "recipe": deployment.recipe, "lock": lock,
            "image": deployment.image, "algorithm": algorithm, "known": known,
            "basis": build.basis if build is not None and known else "",
            "evidence": build.evidence if build is not None and known else "",
            "refuses": refuses, "serves": served if known else [], "companion": companion,
            "text": _text(title=title, algorithm=algorithm, known=known, refuses=refuses,
                          companion=companion)}


def _text(*, title: str, algorithm: str, known: bool, refuses: list[dict[str, Any]],
          companion: str) -> str:
    whats = " or ".join(r["what"] for r in refuses)
    if known and not refuses:
        return f"{title} under {algorithm} serves log-probs and grammar itself."
    if known:
        then = (f"the gateway sends such requests to the companion {companion!r}" if companion
                else "the gateway answers such requests with a 400 naming the need and the fix "
                "(name a companion in the spec to serve them)")
        return f"{title} under {algorithm} cannot {whats}: {then}."
    if not refuses:
        return f"{title} under {algorithm}: nothing recorded is refused by this mode."
    then = (f"the gateway sends requests that need them to the companion {companion!r}"
            if companion else "the gateway passes such requests to the engine, whose own "
            "answer the client gets")
    return (f"What {title} refuses under {algorithm} is not recorded; another build refused "
            f"requests that {whats}: {then}.")
