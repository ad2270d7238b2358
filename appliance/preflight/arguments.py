"""Command-line rules: unknown flags, flags set twice, secrets in the engine's argv."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from appliance.engine.flags import closest_flag, flags_in_argv
from appliance.engine.launch import launch_args
from appliance.engine.spec import SECRET_NAME, SECRET_VALUE, EngineOptions, flag_for
from appliance.preflight.types import Context, Finding, findings


def _engine_flag_findings(ctx: Context, known: frozenset[str], source: str) -> list[Finding]:
    argv = launch_args(dataclasses.replace(ctx.spec, extra_args=[])).argv
    found: list[Finding] = []
    for _, flag in flags_in_argv(argv):
        if flag in known:
            continue
        name = flag[2:].replace("-", "_")
        close = closest_flag(flag, known)
        found += findings("unknown-flag", "error", f"engine.{name}",
                          f"SGLang {source} has no {flag}",
                          f"did you mean {close}?" if close else f"remove {name}")
    return found


def rule_unknown_flag(ctx: Context) -> list[Finding]:
    known = ctx.flags
    if known is None:
        if ctx.recipe is None:
            return []
        return findings("unknown-flag", "info", "extra_args",
                        f"no flag list for recipe {ctx.recipe.name!r}; flags not checked",
                        "generate one with bench/gen_sglang_flags.py")
    source = ctx.recipe.flag_list_name if ctx.recipe else "source"
    found = _engine_flag_findings(ctx, known, str(source))
    for i, flag in flags_in_argv(ctx.spec.extra_args):
        if flag not in known:
            close = closest_flag(flag, known)
            found += findings("unknown-flag", "error", f"extra_args[{i}]",
                              f"SGLang {source} has no {flag}",
                              f"did you mean {close}?" if close else "remove it")
    return found


def rule_duplicate_flag(ctx: Context) -> list[Finding]:
    emitted = {flag for _, flag in flags_in_argv(launch_args(
        dataclasses.replace(ctx.spec, extra_args=[])).argv)}
    found: list[Finding] = []
    seen: set[str] = set()
    for i, flag in flags_in_argv(ctx.spec.extra_args):
        if flag in emitted:
            name = flag[2:].replace("-", "_")
            found += findings("duplicate-flag", "error", f"extra_args[{i}]",
                              f"{flag} is already set from engine.{name}",
                              f"set engine.{name} instead and remove it from extra_args")
        elif flag in seen:
            found += findings("duplicate-flag", "error", f"extra_args[{i}]",
                              f"{flag} appears twice in extra_args", "keep one")
        seen.add(flag)
    return found


def _secret_positions(argv: list[str]) -> Iterable[int]:
    for i, item in enumerate(argv):
        value = item.split("=", 1)[1] if item.startswith("--") and "=" in item else item
        after_secret_flag = i > 0 and argv[i - 1].startswith("--") and \
            bool(SECRET_NAME.search(argv[i - 1])) and "=" not in argv[i - 1]
        inline_secret_flag = item.startswith("--") and "=" in item and \
            bool(SECRET_NAME.search(item.split("=", 1)[0]))
        if SECRET_VALUE.match(value) or after_secret_flag or inline_secret_flag:
            yield i


def rule_secret_in_args(ctx: Context) -> list[Finding]:
    found: list[Finding] = []
    for i in _secret_positions(ctx.spec.extra_args):
        found += findings("secret-in-args", "error", f"extra_args[{i}]",
                          "a token-like value is in the command line, where docker inspect, "
                          "ps and the logs show it", "store it as a secret and list its name "
                          "under secrets: (the runtime passes it as an env var)")
    for f in dataclasses.fields(EngineOptions):
        value = getattr(ctx.engine, f.name)
        if isinstance(value, str) and SECRET_VALUE.match(value):
            found += findings("secret-in-args", "error", f"engine.{f.name}",
                              f"{flag_for(f.name)} holds a token-like value",
                              "store it as a secret and list its name under secrets:")
    return found
