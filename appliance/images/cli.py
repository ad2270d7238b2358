"""`appliance build` and `appliance lock`: a recipe's engine image, built (or found) step
by step with Ctrl-C cancelling it, and the lock written from an image built without one."""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from docker.client import from_env

from appliance.cli_output import EXIT_FINDINGS, EXIT_OK, bad_input, emit
from appliance.engine.recipes import RecipeError, load_recipe
from appliance.engine.spec import FieldError
from appliance.images.build import BuildCancelled, BuildFailed, build_image, image_exists, image_id
from appliance.images.lock import LockError, lock_text, reports_from_image
from appliance.images.plan import BuildError, plan_build

EXIT_CANCELLED = 130


def _build_line(kind: str, data: dict[str, Any], text: bool) -> None:
    if not text:
        print(json.dumps({"kind": kind, **data}), flush=True)
    elif kind == "build_step":
        print(f"step {data['step']}/{data['total']}: {data['text']}", flush=True)
    elif kind != "build_progress":  # download bars: JSON only
        print(f"  {data.get('text', '')}" if kind == "build_log" else data.get("text", ""),
              flush=True)


def cmd_build(args: argparse.Namespace) -> int:
    """Build (or find) a recipe's engine image, streaming each step; Ctrl-C cancels."""

    client = from_env()
    try:
        recipe = load_recipe(args.recipe)
        plan = plan_build(recipe, ca_bundle=args.ca_bundle,
                          base_id=image_id(client, recipe.base_image))
    except RecipeError as exc:
        return bad_input(exc.errors, args.text)
    except BuildError as exc:
        return bad_input([FieldError("recipe", str(exc), "fix the recipe's source, lock or "
                                      "patch entry")], args.text)
    if args.plan:
        return _print_plan(client, recipe, plan, args.text)
    return _build_outcome(_run_build(client, plan, args), args.text)


def _print_plan(client: Any, recipe: Any, plan: Any, text: bool) -> int:
    """What the build would use: the values, not just their names (the CA bundle aside)."""

    exists = image_exists(client, plan.tag)
    args = {k: v for k, v in sorted(plan.buildargs.items()) if not k.startswith("APPLIANCE_CA")}
    src = recipe.sglang
    source = {"pip": src.pip, "git": src.git, "archive": src.archive, "ref": src.ref,
              "key": recipe.source_key, "flags": recipe.flag_list_name}
    data = {"tag": plan.tag, "exists": exists, "base_image": recipe.base_image,
            "base_image_id": plan.labels.get("appliance.base-image-id"),
            "source": {k: v for k, v in source.items() if v},
            "patches": list(recipe.patches),
            "lock": str(recipe.lock_path) if recipe.lock_path else None, "buildargs": args}
    if not text:
        emit(data)
        return EXIT_OK
    print(f"{plan.tag} ({'built' if exists else 'not built'})")
    for key in ("base_image", "base_image_id", "source", "patches", "lock", "buildargs"):
        print(f"  {key}: {data[key]}")
    return EXIT_OK


def cmd_lock(args: argparse.Namespace) -> int:
    """Write a recipe's lock from the pip reports of an image built without one."""

    recipe = load_recipe(args.recipe)
    out = args.out or (recipe.lock_path or Path(f"{recipe.name}.lock.txt"))
    try:
        text = lock_text(reports_from_image(from_env(), args.image),
                         header=f"{recipe.name}: made by `appliance lock` from {args.image}\n"
                                f"SGLang source {recipe.source_key}; install with "
                                "pip install --require-hashes --no-deps -r",
                         index_url=None if args.no_index_hashes else args.index_url)
    except LockError as exc:
        return bad_input([FieldError("image", str(exc), "build the recipe without a lock, "
                                      "then run appliance lock on that image")], args.text)
    Path(out).write_text(text)
    count = len(re.findall(r"^\S+==", text, re.M))
    print(f"{count} packages -> {out}") if args.text else emit({"lock": str(out),
                                                                  "packages": count})
    return EXIT_OK


def _run_build(client: Any, plan: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Runs the build on a thread so Ctrl-C (in the main thread) can cancel it."""

    cancel, finished = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = build_image(
                plan, client=client, no_cache=args.no_cache, cancel=cancel,
                on_event=lambda e: _build_line(e.kind, e.to_dict(), args.text))
        except BaseException as exc:  # handed to the main thread below
            outcome["error"] = exc
        finally:
            finished.set()

    # An Event, not Thread.join, is waited on: an interrupted join can report a live
    # thread as gone.
    threading.Thread(target=run, name="appliance-build", daemon=True).start()
    try:
        while not finished.wait(0.2):
            pass
    except KeyboardInterrupt:
        cancel.set()  # build_image kills the running step's container, then raises
        finished.wait(60)
    return outcome


def _build_outcome(outcome: dict[str, Any], text: bool) -> int:
    error = outcome.get("error")
    if isinstance(error, BuildCancelled):
        _build_line("cancelled", {"text": "build cancelled"}, text)
        return EXIT_CANCELLED
    if isinstance(error, BuildFailed):
        _build_line("failed", {"text": f"build failed: {error.message}", **error.to_dict()},
                    text)
        if text:
            for line in error.last_output_lines[-15:]:
                print(f"  | {line}")
        return EXIT_FINDINGS
    if error is not None:
        raise error
    if "result" not in outcome:
        print("the build did not end within 60 s of the cancel", file=sys.stderr)
        return EXIT_FINDINGS
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction,  # type: ignore[type-arg]
               add_text: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """`build` and `lock`, each added by `add_text` (a subcommand with --text)."""
    cmd = add_text("build", "build a recipe's engine image (skipped when built); Ctrl-C cancels")
    cmd.add_argument("recipe", help="recipe name or YAML file")
    cmd.add_argument("--no-cache", action="store_true", help="rebuild even when built")
    cmd.add_argument("--ca-bundle", type=Path, default=None,
                     help="PEM bundle of a TLS-intercepting proxy, for the download steps")
    cmd.add_argument("--plan", action="store_true",
                     help="print the tag, whether it exists, and the values it builds with")
    cmd.set_defaults(func=cmd_build)
    cmd = add_text("lock", "write a recipe's lock from an image built without one")
    cmd.add_argument("recipe", help="recipe name or YAML file")
    cmd.add_argument("--image", required=True, help="the resolved build's image tag")
    cmd.add_argument("--out", type=Path, default=None, help="where to write (default: the "
                     "recipe's lock path)")
    cmd.add_argument("--index-url", default="https://pypi.org/simple",
                     help="PEP 691 index whose file hashes are added for every pinned version")
    cmd.add_argument("--no-index-hashes", action="store_true",
                     help="only the hashes of the files the build installed")
    cmd.set_defaults(func=cmd_lock)
