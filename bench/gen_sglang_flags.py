"""Generate appliance/data/sglang-<version>-flags.txt from SGLang's real argparse parser.

Why the real parser and not a regex over server_args.py: since 0.5.2x most flags are
declared as annotated dataclass fields (sglang/srt/arg_groups/fields/*.py) and turned
into add_argument calls at runtime, so only the built parser knows every spelling
(aliases such as --tp, deprecated flags such as --disable-cuda-graph).

How it was generated for 0.5.23 (on a machine without GPUs; torch CPU is enough):
    pip download --no-deps sglang==0.5.23 -d /tmp/sgl
    unzip -q -o /tmp/sgl/*.whl -d /tmp/sgl/src
    python3 -m venv /tmp/sglvenv
    /tmp/sglvenv/bin/pip install msgspec numpy orjson psutil pybase64 requests torch \
        packaging pillow starlette pydantic pyzmq tqdm ipython aiohttp
    repo=$PWD  # this repository's root
    cd /tmp/sgl/src && PYTHONPATH=. /tmp/sglvenv/bin/python "$repo/bench/gen_sglang_flags.py" \
        --version 0.5.23 --out "$repo/appliance/data/sglang-0.5.23-flags.txt"
Flags added by an unreleased source (the DDTree PR) are appended with --extra.

A git source whose server_args.py still spells every flag as a literal add_argument call
(the DDTree PR head, 101cd5bd02faab336ada94f78daada6288c1816e) is read with --ast, no imports:
    git show 101cd5bd0:python/sglang/srt/server_args.py > /tmp/ddtree_server_args.py
    python3 bench/gen_sglang_flags.py --version ddtree-101cd5bd0 \
        --ast /tmp/ddtree_server_args.py --out appliance/data/sglang-ddtree-101cd5bd0-flags.txt
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def collect_flags() -> list[str]:
    from sglang.srt.server_args import ServerArgs  # imported from the unpacked wheel

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    flags = {opt for action in parser._actions for opt in action.option_strings}
    return sorted(f for f in flags if f.startswith("--"))


def _literal_flags(tree: ast.AST) -> set[str]:
    """Every "--x" string literal passed positionally to a .add_argument(...) call."""
    flags: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "add_argument":
            continue
        names = [str(a.value) for a in node.args
                 if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
        flags.update(_with_negations(names, _keyword(node, "action")))
    return flags


def _with_negations(names: list[str], action: ast.expr | None) -> list[str]:
    """argparse.BooleanOptionalAction adds --no-<name> for every long option."""
    if isinstance(action, ast.Attribute) and action.attr == "BooleanOptionalAction":
        return names + ["--no-" + n[2:] for n in names if n.startswith("--")]
    return names


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _field_flags(field: ast.AnnAssign) -> list[str]:
    """The flags SGLang's add_cli_args_from_dataclass derives from one annotated field
    (sglang/srt/arg_groups/arg_utils.py): `A[T, "help"]` gives --field-name;
    `A[T, Arg(...)]` gives cli_name or --field-name plus aliases, unless no_cli=True."""
    ann = field.annotation
    if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name)
            and ann.value.id == "A" and isinstance(ann.slice, ast.Tuple)
            and len(ann.slice.elts) >= 2 and isinstance(field.target, ast.Name)):
        return []
    meta = ann.slice.elts[1]
    name = "--" + field.target.id.replace("_", "-")
    if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
        return [name]
    if not (isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name)
            and meta.func.id == "Arg"):
        return []
    no_cli = _keyword(meta, "no_cli")
    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
        return []
    cli_name = _keyword(meta, "cli_name")
    if isinstance(cli_name, ast.Constant) and isinstance(cli_name.value, str):
        name = cli_name.value
    aliases = _keyword(meta, "aliases")
    extra = [e.value for e in getattr(aliases, "elts", [])
             if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return _with_negations([name, *extra], _keyword(meta, "action"))


def _dataclass_flags(tree: ast.AST) -> set[str]:
    flags: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            for item in node.body:
                if isinstance(item, ast.AnnAssign):
                    flags.update(_field_flags(item))
    return flags


def collect_flags_from_source(path: Path) -> list[str]:
    """Flags read from source without importing it (no torch, no GPU): a server_args.py
    file, or a package directory (sglang/srt/server_args.py plus the argument groups under
    sglang/srt/arg_groups/). Both spellings SGLang uses are read: literal add_argument
    calls, and annotated ServerArgs fields turned into arguments at run time."""
    if path.is_dir():
        srt = path / "sglang" / "srt" if (path / "sglang").is_dir() else path / "srt"
        files = [srt / "server_args.py", *sorted((srt / "arg_groups").glob("*.py"))]
    else:
        files = [path]
    flags: set[str] = set()
    for file in files:
        if file.is_file():
            tree = ast.parse(file.read_text())
            flags |= _literal_flags(tree) | _dataclass_flags(tree)
    return sorted(flags)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ast", type=Path,
                    help="read flags from this server_args.py or package directory, no imports")
    ap.add_argument("--extra", action="append", default=[], help="flag added by a PR source")
    args = ap.parse_args(argv)
    found = collect_flags_from_source(args.ast) if args.ast else collect_flags()
    flags = sorted(set(found) | set(args.extra))
    origin = f"the source read with --ast ({args.ast.name})" if args.ast else "the real parser"
    header = [
        f"# SGLang {args.version} launch_server flags, generated by bench/gen_sglang_flags.py",
        f"# from {origin}; one flag per line.",
    ]
    if args.extra:
        header.append(f"# extra flags from a PR source: {' '.join(args.extra)}")
    args.out.write_text("\n".join(header + flags) + "\n")
    print(f"{len(flags)} flags -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
