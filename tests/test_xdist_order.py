"""The order a parallel run hands out its tests in (tests/conftest.py): the exclusive tests
first as one group, then the groups and modules by their expected seconds, longest first."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import EXCLUSIVE_GROUP, _group_of, longest_first


class _Item:
    """What the ordering reads of a pytest item: its node id and its marks."""

    def __init__(self, nodeid: str, group: str | None = None, exclusive: bool = False) -> None:
        self.nodeid = nodeid
        self.marks = ([pytest.mark.xdist_group(group).mark] if group else []) + (
            [pytest.mark.exclusive.mark] if exclusive else [])

    def iter_markers(self, name: str) -> list[Any]:
        return [mark for mark in self.marks if mark.name == name]

    def get_closest_marker(self, name: str) -> Any:
        return next(iter(self.iter_markers(name)), None)


def _ids(items: list[Any]) -> list[str]:
    return [item.nodeid for item in items]


def test_exclusive_tests_are_one_group_first_whatever_their_own_group() -> None:
    items = [_Item("tests/a.py::one"), _Item("tests/b.py::slow", group="faults"),
             _Item("tests/b.py::alone", group="faults", exclusive=True),
             _Item("tests/c.py::alone", exclusive=True)]
    assert [_group_of(item) for item in items] == ["", "faults", EXCLUSIVE_GROUP,  # type: ignore[arg-type]
                                                   EXCLUSIVE_GROUP]
    ordered = longest_first(items, {"tests/a.py": 1.0, "tests/b.py": 500.0,  # type: ignore[arg-type]
                                    "tests/c.py": 1.0})
    assert _ids(ordered) == ["tests/b.py::alone", "tests/c.py::alone", "tests/b.py::slow",
                             "tests/a.py::one"]


def test_units_go_longest_first_and_a_module_in_no_group_stays_together() -> None:
    items = [_Item("tests/quick.py::x"), _Item("tests/quick.py::y"),
             _Item("tests/e2e/one.py::t", group="e2e"), _Item("tests/e2e/two.py::t", group="e2e"),
             _Item("tests/long.py::x"), _Item("tests/long.py::y"), _Item("tests/new.py::t")]
    seconds = {"tests/quick.py": 2.0, "tests/e2e/one.py": 30.0, "tests/e2e/two.py": 30.0,
               "tests/long.py": 50.0}  # tests/new.py has no record yet: it counts 0
    ordered = longest_first(items, seconds)  # type: ignore[arg-type]
    assert _ids(ordered) == ["tests/e2e/one.py::t", "tests/e2e/two.py::t", "tests/long.py::x",
                             "tests/long.py::y", "tests/quick.py::x", "tests/quick.py::y",
                             "tests/new.py::t"]
    assert longest_first(items, {}) == items  # type: ignore[arg-type]  # no record: as collected
