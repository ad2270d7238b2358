"""The seconds each test module took in a whole run, from its JUnit report, for the order a
parallel run hands out work in (tests/conftest.py: longest first):

    .venv/bin/python -m tests.durations var/test-report.xml   # writes tests/durations.json

A module's time is its tests' time, setup and teardown included (module fixtures too)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET  # noqa: S405 (our own test run's report)
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).with_name("durations.json")


def module_of(classname: str) -> str | None:
    """tests.a.test_b(.Class...) -> tests/a/test_b.py, where that file exists."""
    parts = classname.split(".")
    while parts:
        path = "/".join(parts) + ".py"
        if (ROOT / path).is_file():
            return path
        parts.pop()
    return None


def module_seconds(report: Path) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for case in ET.parse(report).iter("testcase"):  # noqa: S314
        module = module_of(case.get("classname", ""))
        if module is not None:
            seconds[module] = seconds.get(module, 0.0) + float(case.get("time") or 0)
    return {module: round(value, 1) for module, value in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    found = module_seconds(Path(argv[0]))
    OUT.write_text("{\n" + ",\n".join(f"  {json.dumps(k)}: {v}" for k, v in found.items())
                   + "\n}\n")
    print(f"{OUT.relative_to(ROOT)}: {len(found)} modules, {sum(found.values()):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
