"""The product's launch argv, and every change the rig makes to it, in one place with why.

The rig starts the real engine with exactly what `appliance launch-args SPEC` gives for the
shipped example specs (the deployment the agent would start), changed only as listed here.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from appliance.cli import resolve_spec
from appliance.engine.launch import launch_args
from appliance.engine.spec import DeploymentSpec, read_spec_file
from appliance.preflight import gpu_check_args

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = {"ddtree": REPO / "examples/kimi-ddtree.yaml", "dflash": REPO / "examples/kimi-dflash.yaml"}

# (spec key, value, why). Spec-level: the self-check and argv both follow them.
SPEC_CHANGES: tuple[tuple[str, object, str], ...] = (
    ("gpus", [0], "one H200 here; the flagship is TP8 over 8 GPUs"),
    ("engine.tp_size", 1, "one GPU; the tiny model has Kimi's 8 heads per GPU at TP8"),
    ("engine.model_path", "{models}/tiny-kimi", "a tiny random-weight model of Kimi's architecture"),
    ("engine.speculative_draft_model_path", "{models}/tiny-kimi-dflash",
     "a tiny random DFlash drafter (block 8) for it"),
)
# (flag, value or None to add a bare flag, why). Argv-level: flags the spec does not carry.
ARGV_CHANGES: tuple[tuple[str, str | None, str], ...] = (
    ("--sampling-backend", "pytorch", "flashinfer is not carried (its wheel is 0.5 GB); sampling"
     " with pytorch is the same greedy argmax at temperature 0"),
    ("--grammar-backend", "none", "xgrammar is not carried; no request uses a grammar"),
)
ENV_CHANGES: dict[str, tuple[str, str]] = {
    "SGLANG_IS_FLASHINFER_AVAILABLE": ("false", "the flashinfer stub must never be chosen"),
}


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    gpu_check: list[str]
    changes: list[str] = field(default_factory=list)


def _set(data: dict[str, object], dotted: str, value: object) -> None:
    node = data
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})  # type: ignore[assignment]
    node[last] = value


def _spec(example: str, models: str, spec_overrides: dict[str, object]) -> tuple[DeploymentSpec, list[str]]:
    data = read_spec_file(EXAMPLES[example])
    changes = []
    for key, value, why in SPEC_CHANGES:
        value = value.format(models=models) if isinstance(value, str) else value
        _set(data, key, value)
        changes.append(f"{key} = {value!r}: {why}")
    for key, value in spec_overrides.items():
        value = value.format(models=models) if isinstance(value, str) else value
        _set(data, key, value)
        changes.append(f"{key} = {value!r}: this run's own change")
    # The product's own road from a spec file: the recipe's engine defaults laid under it.
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as handle:
        yaml.safe_dump(data, handle)
        handle.flush()
        spec, _, recipe_errors = resolve_spec(handle.name)
    if recipe_errors:
        raise SystemExit(f"the recipe did not load: {recipe_errors}")
    return spec, changes


def _apply_flag(argv: list[str], flag: str, value: str | None) -> None:
    if flag in argv:
        index = argv.index(flag)
        if value is not None:
            argv[index + 1] = value
    else:
        argv.extend([flag] if value is None else [flag, value])


def launch(example: str, models: str, *, spec_overrides: dict[str, object] | None = None,
           argv_overrides: dict[str, str | None] | None = None,
           drop_flags: tuple[str, ...] = (), grammar: bool = False) -> Launch:
    """The product's argv for an example spec, with the rig's changes and the run's own.
    `grammar`: xgrammar is carried, so the grammar backend stays the product's (SGLang's
    default) instead of `none`."""
    spec, changes = _spec(example, models, spec_overrides or {})
    plan = launch_args(spec)
    argv = list(plan.argv)
    for flag, value, why in ARGV_CHANGES:
        if grammar and flag == "--grammar-backend":
            changes.append("--grammar-backend left as the product has it: xgrammar is carried")
            continue
        _apply_flag(argv, flag, value)
        changes.append(f"{flag} {value or ''}: {why}".replace("  ", " "))
    for flag, value in (argv_overrides or {}).items():
        _apply_flag(argv, flag, value)
        changes.append(f"{flag} {value or ''}: this run's own change")
    for flag in drop_flags:
        if flag in argv:
            index = argv.index(flag)
            takes_value = index + 1 < len(argv) and not argv[index + 1].startswith("--")
            del argv[index:index + (2 if takes_value else 1)]
            changes.append(f"- {flag}: this run's own change")
    env = dict(plan.env)
    for name, (value, why) in ENV_CHANGES.items():
        env[name] = value
        changes.append(f"env {name}={value}: {why}")
    return Launch(argv=argv, env=env, gpu_check=gpu_check_args(spec), changes=changes)
