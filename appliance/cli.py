"""`appliance` command line: JSON on stdout by default, human text with --text.

Exit codes: 0 fine, 1 pre-flight found an error (or a command failed), 2 bad spec or usage,
130 a build cancelled with Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from appliance import selfcheck
from appliance.bench.cli import add_parser as add_bench
from appliance.bench.verify_cli import add_parser as add_verify
from appliance.cli_output import EXIT_FINDINGS, EXIT_OK, bad_input, emit
from appliance.engine.launch import launch_args
from appliance.engine.recipes import Recipe, RecipeError, load_recipe
from appliance.engine.spec import (
    DeploymentSpec,
    FieldError,
    SpecError,
    read_spec_file,
    spec_from_dict,
)
from appliance.images.cli import add_parser as add_build
from appliance.logs.catalogue import catalogue_rows
from appliance.logs.diagnosis import diagnose
from appliance.logs.facts import spec_facts
from appliance.logs.parser import parse_lines
from appliance.logs.stamps import without_docker_stamps
from appliance.preflight import Finding, has_errors, read_config, read_weights_bytes, run_preflight
from appliance.preflight import folders as local_folders
from appliance.preflight.files import MODEL_FIELDS
from appliance.store.loadtime import add_parser as add_store
from appliance.tune.cli import add_parser as add_tune


def resolve_spec(path: str) -> tuple[DeploymentSpec, Recipe | None, list[FieldError]]:
    """Read a spec file, lay the recipe's engine defaults under it, and validate.

    A recipe that cannot be loaded is not a spec error here: pre-flight reports it.
    """
    data = read_spec_file(path)
    recipe: Recipe | None = None
    recipe_errors: list[FieldError] = []
    if isinstance(data.get("recipe"), str):
        try:
            recipe = load_recipe(data["recipe"])
        except RecipeError as exc:
            recipe_errors = exc.errors
    defaults = recipe.engine_defaults if recipe else None
    return spec_from_dict(data, engine_defaults=defaults), recipe, recipe_errors


def cmd_launch_args(args: argparse.Namespace) -> int:
    spec, _, recipe_errors = resolve_spec(args.spec)
    if recipe_errors:
        return bad_input([FieldError("recipe", e.message, e.fix) for e in recipe_errors],
                          args.text)
    plan = launch_args(spec)
    if args.text:
        env = " ".join(f"{k}={v}" for k, v in sorted(plan.env.items()))
        print((env + " " if env else "") + " ".join(plan.argv))
    else:
        emit(plan.to_dict())
    return EXIT_OK


def cmd_preflight(args: argparse.Namespace) -> int:
    spec, recipe, recipe_errors = resolve_spec(args.spec)
    findings = [Finding("recipe", "error", "recipe", e.message, e.fix) for e in recipe_errors]
    if not recipe_errors:
        host = None
        if args.gpu_name:  # the host's GPU model, for the architecture rules
            count = max(spec.gpus, default=0) + 1
            host = [{"index": i, "name": args.gpu_name} for i in range(count)]
        folders, local, unchecked = _local_model_facts(spec, args.models_dir)
        findings += run_preflight(spec, recipe=recipe, gpu_memory_gb=args.gpu_memory_gb,
                                  host_gpus=host, model_folders=folders, **local)
        findings += unchecked
    if args.text:
        for f in findings:
            print(f"{f.severity:<7} {f.rule} [{f.field}]: {f.message}\n        fix: {f.fix}")
        errors = sum(f.severity == "error" for f in findings)
        warnings = sum(f.severity == "warning" for f in findings)
        print(f"{errors} error(s), {warnings} warning(s)")
    else:
        emit({"findings": [f.to_dict() for f in findings]})
    return EXIT_FINDINGS if has_errors(findings) else EXIT_OK


def _local_model_facts(spec: DeploymentSpec, models_dir: str | None
                       ) -> tuple[dict[str, Any] | None, dict[str, Any], list[Any]]:
    """The model folders as the panel checks them (appliance.preflight.folders), found under
    --models-dir, else $APPLIANCE_MODELS_DIR, else /models; where none is on this machine,
    a finding that says the folders were not checked."""
    root = models_dir or os.environ.get("APPLIANCE_MODELS_DIR") or local_folders.MODELS_MOUNT
    paths = {f: getattr(spec.engine, f.split(".", 1)[1]) for f in MODEL_FIELDS}
    if not os.path.isdir(root):
        return None, {}, [Finding(
            "model-files-not-checked", "info", fld,
            f"not checked: {path!r} was not looked for, no models folder {root!r} on this "
            "machine", "run pre-flight on the GPU host, or pass --models-dir DIR (the "
            "host's APPLIANCE_MODELS_DIR), to check that the folder exists with config.json "
            "and weights") for fld, path in paths.items() if path]
    target = local_folders.model_local_path(spec.engine.model_path, [root])
    drafter = local_folders.model_local_path(spec.engine.speculative_draft_model_path, [root])
    facts = {"model_config": read_config(target), "drafter_config": read_config(drafter),
             "weights_bytes": read_weights_bytes(target),
             "drafter_weights_bytes": read_weights_bytes(drafter)}
    return local_folders.model_folders(spec, [root]), facts, []


def _open_lines(name: str) -> Iterator[str]:
    """Lines of a file or stdin as the engine printed them: undecodable bytes replaced
    (engine logs hold tqdm bars), Docker's time prefix (`docker logs -t`) split off."""
    if name == "-":
        yield from without_docker_stamps(sys.stdin)
        return
    with open(name, encoding="utf-8", errors="replace", newline="\n") as handle:
        yield from without_docker_stamps(handle)


def _print_event(event: dict[str, Any], text: bool, out: TextIO) -> None:
    if text:
        rest = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("line", "kind"))
        out.write(f"{event['line']:>6} {event['kind']:<17} {rest}\n")
    else:
        out.write(json.dumps(event) + "\n")


def _log_facts(args: argparse.Namespace) -> dict[str, Any] | None:
    """What the deployment's spec says (--spec), for the causes that quote it."""
    if not getattr(args, "spec", None):
        return None
    return spec_facts(resolve_spec(args.spec)[0])


def cmd_parse_log(args: argparse.Namespace) -> int:
    for event in parse_lines(_open_lines(args.file), include_all=args.all,
                             facts=_log_facts(args)):
        _print_event(event.to_dict(), args.text, sys.stdout)
    return EXIT_OK


def cmd_diagnose(args: argparse.Namespace) -> int:
    result = diagnose(_open_lines(args.file), facts=_log_facts(args))
    if args.text:
        if result is None:
            print("no failure cause found")
        else:
            print(f"cause:   {result.cause}\nsummary: {result.summary}\nfix:     {result.fix}")
    else:
        emit({"diagnosis": result.to_dict() if result else None})
    return EXIT_OK


def cmd_causes(args: argparse.Namespace) -> int:
    rows = catalogue_rows()
    if args.text:
        for row in rows:
            print(f"{row['id']} ({row['part']}, priority {row['priority']})\n"
                  f"  summary: {row['summary']}\n  fix:     {row['fix']}")
    else:
        emit({"causes": rows})
    return EXIT_OK


def cmd_gpu_check(rest: list[str]) -> int:
    return int(selfcheck.main(rest))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("--text", action="store_true", help="human-readable text, not JSON")
        return cmd

    cmd = add("launch-args", "print the engine container's argv and env")
    cmd.add_argument("spec", help="deployment spec YAML file")
    cmd.set_defaults(func=cmd_launch_args)
    cmd = add("preflight", "check a spec; exit 1 on any error finding")
    cmd.add_argument("spec", help="deployment spec YAML file")
    cmd.add_argument("--gpu-memory-gb", type=float, help="memory of one GPU, for gpu-memory")
    cmd.add_argument("--gpu-name", help="the host's GPU model as nvidia-smi names it (e.g. "
                     "'NVIDIA B200'), for the attention backend rules")
    cmd.add_argument("--models-dir", help="the host's models folder (APPLIANCE_MODELS_DIR; "
                     "default $APPLIANCE_MODELS_DIR, else /models): the spec's /models/<name> "
                     "paths are checked there, as the panel checks them")
    cmd.set_defaults(func=cmd_preflight)
    cmd = add("parse-log", "print one JSON object per engine log event")
    cmd.add_argument("file", help="log file, or - for stdin")
    cmd.add_argument("--all", action="store_true", help="also print lines that match nothing")
    cmd.add_argument("--spec", help="the deployment's spec YAML: its paths, GPUs and tp_size "
                     "tell the causes whose value is wrong")
    cmd.set_defaults(func=cmd_parse_log)
    add_build(sub, add)
    cmd = add("diagnose", "print the most likely failure cause of an engine log")
    cmd.add_argument("file", help="log file, or - for stdin")
    cmd.add_argument("--spec", help="the deployment's spec YAML: its paths, GPUs and tp_size "
                     "tell the causes whose value is wrong")
    cmd.set_defaults(func=cmd_diagnose)
    cmd = add("causes", "list the failure catalogue: every cause a diagnosis may name")
    cmd.set_defaults(func=cmd_causes)

    add_bench(sub)

    add_verify(sub)

    add_store(sub)

    add_tune(sub)
    # Listed for --help only: main() hands gpu-check's own arguments (--help, --gpus ...)
    # to the self-check untouched, which argparse.REMAINDER cannot do for a leading option.
    sub.add_parser("gpu-check", help="GPU self-check (inside the engine container); "
                   "see appliance gpu-check --help", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["gpu-check"]:
        return cmd_gpu_check(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SpecError as exc:
        return bad_input(exc.errors, getattr(args, "text", False))
    except FileNotFoundError as exc:
        return bad_input([FieldError("", f"no such file: {exc.filename}", "check the path")],
                          getattr(args, "text", False))
    except BrokenPipeError:
        # `appliance parse-log big.log | head` closes the pipe early; that is not a failure.
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

