"""A placement's engine image on a host's own Docker: built from the recipe the spec names,
its lock the panel's, its build events shipped to the panel in batches."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from appliance.engine.recipes import RecipeError, load_site_recipe
from appliance.images.build import BuildEvent, build_image, image_id
from appliance.images.lock import LOCK_LABEL, lock_digest
from appliance.images.plan import BuildError, plan_build, recipe_lock_path
from appliance.runtime.agent_settings import RemoteSettings
from appliance.runtime.containers import (
    EngineRuntime,
)
from appliance.runtime.follow_threads import Events

log = logging.getLogger(__name__)


class HostBuildRefused(RuntimeError):
    """This host cannot build the placement's image as the panel has it (no such recipe
    here, or one with another lock): the message says what to fix."""


BUILD_SHIP_EVENTS = 200  # a build's output goes to the panel in batches of this many ...
BUILD_SHIP_S = 0.5  # ... or after this long, whichever comes first


def host_image(placement: Mapping[str, Any], config: RemoteSettings, runtime: EngineRuntime,
               ship: Any, cancel: threading.Event) -> str:
    """The placement's engine image, built on this host's Docker from the recipe its spec
    names (the panel builds none for a joined host: web/builder/builds.py), or found built
    already; its build events shipped in batches through `ship`. The recipe is this host's
    (a site recipe in `recipes_dir` wins over a shipped one, as on the panel); its lock must
    be the panel's (`lock_digest`), else HostBuildRefused before anything is built.
    BuildFailed and BuildCancelled as build_image raises them."""
    name = str((placement.get("spec") or {}).get("recipe") or "")
    try:
        recipe = load_site_recipe(name, config.recipes_dir)
        lock = recipe_lock_path(recipe)
    except (RecipeError, BuildError) as exc:
        raise HostBuildRefused(f"this host has no recipe {name!r} to build the engine image "
                               f"from ({exc}): give it the panel's recipe file in "
                               "APPLIANCE_RECIPES_DIR") from None
    found = lock_digest(lock.read_bytes()) if lock is not None else ""
    wanted = placement.get("lock_digest")
    if wanted is not None and found != wanted:
        raise HostBuildRefused(
            f"this host's recipe {name!r} has the lock {found or 'none'}, the panel's "
            f"{wanted or 'none'}: give the host the panel's recipe and lock files "
            "(APPLIANCE_RECIPES_DIR), or run the panel's image version here")
    bundle = Path(config.build_ca_bundle) if config.build_ca_bundle else None
    if bundle is not None and not (bundle.is_file() and bundle.stat().st_size):
        bundle = None  # compose mounts /dev/null there when no CA is set
    plan = plan_build(recipe, ca_bundle=bundle,
                      base_id=image_id(runtime.client, recipe.base_image))
    pending: Events = []
    shipped_at = time.monotonic()

    def on_event(event: BuildEvent) -> None:
        nonlocal shipped_at
        pending.append(("build", event.to_dict()))
        if len(pending) >= BUILD_SHIP_EVENTS or time.monotonic() - shipped_at > BUILD_SHIP_S:
            ship(pending[:])
            pending.clear()
            shipped_at = time.monotonic()

    try:
        return build_image(plan, client=runtime.client,
                           no_cache=bool(placement.get("rebuild_image")), cancel=cancel,
                           on_event=on_event).tag
    finally:
        if pending:
            ship(pending[:])


def image_lock_refusal(runtime: EngineRuntime, image: str, wanted: str | None) -> str:
    """Why this image must not run here ('' when it may): its recipe lock label differs from
    the lock the panel sends. None from the panel: a configured image, no lock to match."""
    if wanted is None:
        return ""
    try:
        labels = runtime.client.images.get(image).labels or {}
    except Exception:  # noqa: BLE001 - missing image: the start says so in its own words
        return ""
    found = labels.get(LOCK_LABEL, "")
    if found == wanted:
        return ""
    return (f"image {image} was built from another recipe lock ({found or 'none'}) than the "
            f"panel's ({wanted or 'none'}): rebuild it from the panel's recipe on this host")
