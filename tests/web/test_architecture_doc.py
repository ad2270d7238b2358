"""The lifecycle is drawn twice for readers (appliance/lifecycle.py's docstring and
docs/architecture.md); both drawings say what TRANSITIONS says, row for row."""

from __future__ import annotations

import re
from pathlib import Path

from appliance import lifecycle

ROOT = Path(__file__).resolve().parents[2]
Row = tuple[str, frozenset[str], str]


def _table() -> list[Row]:
    return [(m.target.value, frozenset(s.value for s in m.sources), m.by.value)
            for m in lifecycle.TRANSITIONS]


def _row(status: str, sources: str, by: str) -> Row:
    made_by = re.sub(r"\s*\(.*\)$", "", by.strip())  # "agent (restart policy)": agent
    return status.strip(), frozenset(s.strip() for s in sources.split(",")), made_by


def docstring_rows(text: str) -> list[Row]:
    rows = []
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == 3 and cells[0] in set(lifecycle.Status):
            rows.append(_row(*cells))
    return rows


def markdown_rows(text: str) -> list[Row]:
    rows = []
    for line in text.splitlines():
        cells = [c for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].strip() in set(lifecycle.Status):
            rows.append(_row(*cells))
    return rows


def test_the_modules_docstring_draws_the_table() -> None:
    assert docstring_rows(lifecycle.__doc__ or "") == _table()


def test_the_architecture_page_draws_the_table() -> None:
    assert markdown_rows((ROOT / "docs/architecture.md").read_text()) == _table()


def test_a_drawing_that_drifts_is_caught() -> None:
    drifted = (lifecycle.__doc__ or "").replace("stopped, failed ", "stopped         ", 1)
    assert docstring_rows(drifted) != _table()


def test_the_architecture_page_names_the_files_of_each_change() -> None:
    page = (ROOT / "docs/architecture.md").read_text()
    for heading in ("Add a deployment action", "Add a failure cause", "Add an alert"):
        section = page.split(f"### {heading}", 1)[1].split("###", 1)[0]
        named = set(re.findall(r"`((?:appliance|web|worker|tests)/[\w/.]+\.py)`", section))
        assert named, heading
        assert all((ROOT / path).is_file() for path in named), sorted(
            p for p in named if not (ROOT / p).is_file())
