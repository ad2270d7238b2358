"""What the simulated engine refuses: the per-build table the appliance keeps
(appliance/engine/refusals.py, itself held to the real engine's recordings), never the
algorithm's name. The image cannot import the appliance, so a copy of the table ships
beside this module (refusals.json, written by `python3 -m appliance.engine.refusals write
docker/test-engine/sglang/test_engine/refusals.json`; tests/testengine/
test_test_engine_builds.py holds it equal to the table).

TEST_ENGINE_BUILD names the build the simulator imitates (a release, e.g. "0.5.23", or a
commit's first 9 hex digits, as Recipe.source_key keys builds); by default 433c58ed7, the
build whose recordings its acceptance and step costs play. A build the table does not know,
or one without the launch's algorithm (DDTREE is in no release), stops the launch (exit 2):
the simulator does not guess what an unrecorded build refuses.

How a refusal is answered (a 400 on /generate and /v1, a streamed grammar refusal as a 200
whose one event is the error, streamed chat log-probs as a 500) is 433c58ed7's, the one
build recorded refusing; the message is the table's for the build.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("refusals.json")
DEFAULT_BUILD = "433c58ed7"
GRAMMAR, LOGPROBS = "grammar", "logprobs"


class BuildError(Exception):
    """The build named cannot be imitated: said at launch."""


@dataclass(frozen=True)
class Refusals:
    """One build's refusals under one algorithm: need -> the engine's message."""

    build: str
    title: str
    basis: str
    algorithm: str
    refused: dict[str, str] = field(default_factory=dict)

    def message(self, need: str) -> str | None:
        return self.refused.get(need)

    def says(self) -> str:
        """One line for the log and /server_info: whose refusals these are."""
        what = ", ".join(sorted(self.refused)) or "nothing"
        return (f"refuses {what} under {self.algorithm}, as {self.title} does "
                f"({self.basis}, appliance/engine/refusals.py)")

    def to_dict(self) -> dict[str, Any]:
        return {"build": self.build, "title": self.title, "basis": self.basis,
                "algorithm": self.algorithm, "refused": dict(self.refused)}


def table() -> dict[str, Any]:
    return dict(json.loads(TABLE.read_text()))


def for_build(build: str, algorithm: str) -> Refusals:
    """The refusals of `build` (DEFAULT_BUILD when empty) under `algorithm` (upper case)."""
    name = build or DEFAULT_BUILD
    builds = table()["builds"]
    entry = builds.get(name)
    if entry is None:
        raise BuildError(f"TEST_ENGINE_BUILD={name}: no such build in the refusal table "
                         f"({TABLE.name}, from appliance/engine/refusals.py); one of "
                         f"{', '.join(sorted(builds))}")
    refused = entry["refused"].get(algorithm)
    if refused is None:
        raise BuildError(f"TEST_ENGINE_BUILD={name}: {entry['title']} has no {algorithm} "
                         f"(it has {', '.join(sorted(entry['refused']))}); name a build that "
                         "has it")
    return Refusals(build=name, title=entry["title"], basis=entry["basis"],
                    algorithm=algorithm, refused=dict(refused))
