"""Product files say what they protect, not where a change came from, and name nothing
outside the repository: no comment or docstring cites an issue number or a work round, and
no file points at a path beside the checkout (a reader of the repository has only it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("appliance", "web", "worker", "docker", "bench")
TEXT = {".py", ".sh", ".html", ".js", ".css", ".yaml", ".yml", ".toml", ".md", ".txt", ".cfg",
        ".json", ".conf", ".sql", ""}
SKIPPED = {"vendor", "__pycache__", "node_modules"}

ISSUE = re.compile(r"\bissues?\s*#?\s*\d+", re.IGNORECASE)
# "#41" as a citation; an upstream pull request ("PR #27509": which source a fact comes
# from) and a quoted tool message ("Hunk #2 FAILED") are no citation of this project's.
HASH_NUMBER = re.compile(r"(?<![\w&/{\"'=:#.-])(?<!PR )(?<!Hunk )#\d+\b")
ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
ROUND = re.compile(ORDINAL + r"\s+(?:#\s*)?round\b(?![- ]trips?\b)", re.IGNORECASE)
OUTSIDE = re.compile(r"\.\./shared\b|\bshared/(?:DESIGN|SGLANG)\b|\b(?:DESIGN|SGLANG)\.md\b"
                     r"|shared/sglang-src|/work/")


def _product_files() -> list[Path]:
    found = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*")):
            if (path.is_file() and not SKIPPED & set(path.relative_to(ROOT).parts)
                    and (path.suffix in TEXT or path.name == "Dockerfile")
                    and not path.name.endswith(".min.js")):
                found.append(path)
    return found


def _findings(pattern: re.Pattern[str], *, css_ok: bool = False) -> list[str]:
    hits = []
    for path in _product_files():
        if css_ok and path.suffix in {".css", ".js", ".html", ".json"}:
            continue  # colours (#000) and selectors, not citations
        text = path.read_text(errors="replace")
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            hits.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}")
    return hits


def test_the_scan_reads_the_product_files() -> None:
    names = {str(p.relative_to(ROOT)) for p in _product_files()}
    assert {"web/settings.py", "worker/celery.py", "appliance/lifecycle.py",
            "bench/flagship_image.sh"} <= names
    assert not any("/vendor/" in n for n in names)


def test_the_patterns_catch_what_they_are_for() -> None:
    assert ISSUE.search("(issue 22's profile)") and ISSUE.search("Issue #7")
    assert HASH_NUMBER.search("as #41 asked") and not HASH_NUMBER.search("PR #27509 head")
    assert not HASH_NUMBER.search('fill="#111827"') and not HASH_NUMBER.search("Hunk #2 FAILED")
    assert ROUND.search("(issue 22, fourth\nround)") and ROUND.search("# the 7th\n# round")
    assert not ROUND.search("the second round trip") and not ROUND.search("round 3 of the bench")
    assert OUTSIDE.search("(shared/DESIGN.md)") and OUTSIDE.search("../shared/sglang-src")
    assert OUTSIDE.search("/work/main/bench/x.py") and not OUTSIDE.search("docs/fleet.md")


def test_no_product_file_cites_an_issue_number() -> None:
    assert _findings(ISSUE) == []
    assert _findings(HASH_NUMBER, css_ok=True) == []


def test_no_product_file_cites_a_round() -> None:
    assert _findings(ROUND) == []


def test_no_product_file_points_outside_the_repository() -> None:
    assert _findings(OUTSIDE) == []
