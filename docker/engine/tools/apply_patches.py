#!/usr/bin/env python3
"""Applies the recipe's patches in order, each checked with a dry run first.

A patch that does not apply stops the build with one machine-readable line,
`APPLIANCE_PATCH_FAILED {"patch": ..., "file": ..., "hunk": ..., "line": ...}`,
after GNU patch's own output, so the build log names the patch, the file and the hunk.
Runs on the image's python3 (standard library only).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

MARKER = "APPLIANCE_PATCH_FAILED"
# GNU patch: "checking file x" (dry run) / "patching file x"; then "Hunk #2 FAILED at 41."
FILE_RE = re.compile(r"^(?:checking|patching) file '?(?P<file>[^']+?)'?$")
HUNK_RE = re.compile(r"^Hunk #(?P<hunk>\d+) FAILED at (?P<line>\d+)")
MISSING_RE = re.compile(r"^can't find file to patch at input line (?P<line>\d+)")
HEADER_RE = re.compile(r"^\|?\+\+\+ (?:b/)?(?P<file>\S+)")


def read_series(series: Path) -> list[str]:
    lines = series.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def source_root(arg: str) -> tuple[Path, int] | None:
    """Where to apply and the strip level. Patches are written against the git layout
    (python/sglang/...): a checkout takes -p1, an installed package's site-packages -p2."""
    if arg != "auto":
        return Path(arg), 1
    checkout = Path("/opt/sglang")
    if checkout.is_dir():
        return checkout, 1
    try:
        import sglang  # type: ignore[import-not-found]  # noqa: PLC0415 - optional here
    except ImportError:
        return None
    return Path(sglang.__file__).resolve().parent.parent, 2


def failure(patch: str, output: str) -> dict[str, object]:
    """The first failing file and hunk in patch's output."""
    current: str | None = None
    lines = [raw.strip() for raw in output.splitlines()]
    for index, line in enumerate(lines):
        if m := FILE_RE.match(line):
            current = m.group("file")
        elif m := HUNK_RE.match(line):
            return {"patch": patch, "file": current, "hunk": int(m.group("hunk")),
                    "line": int(m.group("line"))}
        elif MISSING_RE.match(line):
            # GNU patch quotes the diff header after this line: "|+++ b/<file>".
            headers = (HEADER_RE.match(x) for x in lines[index:])
            missing = next((h.group("file") for h in headers if h), current)
            return {"patch": patch, "file": missing, "hunk": None, "line": None,
                    "reason": "file to patch not found"}
    return {"patch": patch, "file": current, "hunk": None, "line": None}


def run_patch(root: Path, strip: int, patch_file: Path, dry_run: bool) -> tuple[int, str]:
    # --fuzz=0: a hunk whose context no longer matches is stale; GNU patch's default fuzz
    # would apply it somewhere close and build a different engine than the one reviewed.
    argv = ["patch", f"-p{strip}", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch",
            "-d", str(root), "-i", str(patch_file)]
    if dry_run:
        argv.append("--dry-run")
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def apply_one(root: Path, strip: int, patch_file: Path) -> int:
    name = patch_file.name
    rc, output = run_patch(root, strip, patch_file, dry_run=True)
    if rc != 0:
        print(output, end="")
        detail = failure(name, output)
        print(f"patch {name} does not apply: file {detail['file']}, hunk #{detail['hunk']}",
              file=sys.stderr)
        print(f"{MARKER} {json.dumps(detail)}", flush=True)
        return 1
    rc, output = run_patch(root, strip, patch_file, dry_run=False)
    print(output, end="")
    if rc != 0:  # the dry run passed, so this is an I/O problem, not a stale patch
        print(f"{MARKER} {json.dumps(failure(name, output))}", flush=True)
        return 1
    print(f"appliance: applied {name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--series", type=Path, required=True)
    parser.add_argument("--patches-dir", type=Path, required=True)
    parser.add_argument("--source-root", default="auto")
    parser.add_argument("--strip", type=int, default=None)
    args = parser.parse_args(argv)
    names = read_series(args.series) if args.series.exists() else []
    if not names:
        print("appliance: no patches to apply")
        return 0
    located = source_root(args.source_root)
    if located is None:
        print("appliance: patches listed but no SGLang source to apply them to", file=sys.stderr)
        return 1
    root, strip = located
    strip = args.strip if args.strip is not None else strip
    for name in names:
        if apply_one(root, strip, args.patches_dir / name) != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
