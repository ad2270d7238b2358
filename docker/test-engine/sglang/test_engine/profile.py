"""Recorded speculation: the simulator's acceptance and step costs come from a real run.

Each speculative mode of the simulator plays the measurements of one recording of the real
engine (tests/fixtures/real-engine/<source>/<run>/, in the image at
/opt/test-engine/recordings/): per concurrency level the run was benched at, its bench.json
gives the mean accept length (SGLang's own, read from /server_info after the level), the
mean TPOT and the mean TTFT. From these:

- accepted tokens per verify step: the recorded mean accept length, played exactly (a
  running sum: each step takes floor(sum) - floor(sum before)), at most the block;
- a speculative step (draft and verify together: a recording times them only together, as
  a request sees them) lasts the level's time per token x accept length; a plain step, the
  no-speculation run's time per token (from the recording set's baseline run). The time per
  token is the one the level's throughput implies: each of the c slots held a request for
  duration x c / completed seconds on average, of which the mean TTFT went to the first
  token and the rest to the others (with few requests per level the slowest ones stretch a
  level past its mean TPOT: playing the mean TPOT would overstate the throughput);
- a request's first token waits the recorded mean TTFT (the prefill and the scheduler's
  queue as the bench saw them) unless TEST_ENGINE_PREFILL_TOKEN_S sets a prefill rate;
- between recorded levels the figures are interpolated on the number of requests running
  (linear; outside the recorded levels the nearest level's).

Which recording: a set names one run per algorithm (DDTREE per budget, DFLASH per block);
the mode's run is the one for the launch's algorithm with the nearest budget or block.
TEST_ENGINE_RECORDING names a run outright (e.g. a wrong drafter's); TEST_ENGINE_RECORDING_SET
chooses the set (default: `trained`, the trained pair's runs, where the image has them, else
`random`, the random-weight runs). TEST_ENGINE_ACCEPT_LEN and TEST_ENGINE_TOKEN_S still
override the accept length and the step time (tests that pace the engine themselves).
"""

from __future__ import annotations

import bisect
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang.test_engine.settings import ACCEPT_LEN, TOKEN_S

# The bench levels of the runs the sets name, copied from their bench.json (`python3 -m
# sglang.test_engine.profile write` in the checkout; tests/testengine/test_recorded_speculation.py
# holds the copy equal to the recordings): an image without the recordings (the simulated
# hosts') plays the same figures.
SHIPPED = Path(__file__).resolve().with_name("recorded_levels.json")
_IMAGE = Path(__file__).resolve().parents[2] / "recordings"
_CHECKOUT = Path(__file__).resolve().parents[4] / "tests" / "fixtures" / "real-engine"
RECORDINGS = Path(os.environ.get("TEST_ENGINE_RECORDINGS", "") or
                  (_IMAGE if _IMAGE.is_dir() else _CHECKOUT))

# One run per mode: NONE, DFLASH by block size, DDTREE by budget.
SETS: dict[str, dict[str, dict[int, str]]] = {
    "trained": {
        "NONE": {0: "433c58ed7/trained_base"},
        "DFLASH": {8: "433c58ed7/trained_dflash"},
        "DDTREE": {8: "433c58ed7/trained_ddtree_b8", 16: "433c58ed7/trained_ddtree_b16",
                   32: "433c58ed7/trained_ddtree_b32"},
    },
    "random": {
        "NONE": {0: "433c58ed7/base_triton"},
        "DFLASH": {8: "433c58ed7/dflash_triton", 4: "433c58ed7/dflash_block4"},
        "DDTREE": {32: "433c58ed7/ddtree_triton"},
    },
}
DEFAULT_SET = "trained"


class ProfileError(Exception):
    """A named recording is missing or holds no bench: said at launch."""


@dataclass(frozen=True)
class Level:
    concurrency: int
    accept_len: float  # 1.0 for no speculation
    tpot_s: float  # the level's mean TPOT
    ttft_s: float
    output_throughput: float
    token_s: float  # the time per token its throughput implies (the module says how)


@dataclass
class Profile:
    """One recording's levels, and how the simulator reads them."""

    run: str  # e.g. "433c58ed7/trained_dflash"
    levels: list[Level]
    algorithm: str
    size: int = 0  # the recorded budget (DDTREE) or block (DFLASH); 0 none
    _conc: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.levels.sort(key=lambda lv: lv.concurrency)
        self._conc = [lv.concurrency for lv in self.levels]

    def _at(self, running: int, attr: str) -> float:
        values = [getattr(lv, attr) for lv in self.levels]
        if running <= self._conc[0]:
            return float(values[0])
        if running >= self._conc[-1]:
            return float(values[-1])
        i = bisect.bisect_right(self._conc, running)
        lo, hi = self._conc[i - 1], self._conc[i]
        share = (running - lo) / (hi - lo)
        return float(values[i - 1] + share * (values[i] - values[i - 1]))

    def accept_len(self, running: int) -> float:
        return self._at(running, "accept_len")

    def tpot_s(self, running: int) -> float:
        return self._at(running, "tpot_s")

    def token_s(self, running: int) -> float:
        return self._at(running, "token_s")

    def ttft_s(self, running: int) -> float:
        return self._at(running, "ttft_s")

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "algorithm": self.algorithm, "size": self.size,
                "levels": [lv.__dict__ for lv in self.levels]}


KEPT = ("concurrency", "completed", "duration_s", "total_output_tokens", "output_throughput",
        "accept_len", "tpot_ms", "ttft_ms")


def recorded_levels(run: str) -> list[dict[str, Any]]:
    """A run's bench levels (the fields KEPT): from its bench.json where the recordings are
    here, else from the copy shipped beside this module."""
    folder = Path(run) if Path(run).is_absolute() else RECORDINGS / run
    path = folder / "bench.json"
    if path.is_file():
        try:
            bench = json.loads(path.read_text())
        except ValueError as exc:
            raise ProfileError(f"recording {run}: {path} is not JSON ({exc})") from exc
        return [{k: lv.get(k) for k in KEPT} for entry in bench
                for lv in ((entry.get("json") or {}).get("levels") or [])]
    shipped = json.loads(SHIPPED.read_text()) if SHIPPED.is_file() else {}
    if run in shipped:
        return list(shipped[run])
    raise ProfileError(f"recording {run}: no bench.json in {folder}, nor in {SHIPPED.name}")


def write_shipped() -> dict[str, list[dict[str, Any]]]:
    """The copy of every named run's levels (and accept-collapse's), from the recordings."""
    runs = sorted({r for s in SETS.values() for runs in s.values() for r in runs.values()}
                  | set(COLLAPSE_RUNS))
    copied = {run: recorded_levels(run) for run in runs
              if (RECORDINGS / run / "bench.json").is_file()}
    SHIPPED.write_text(json.dumps(copied, indent=1, sort_keys=True) + "\n")
    return copied


def load_profile(run: str, *, algorithm: str, size: int = 0) -> Profile:
    """A run's bench levels as a profile (each level's mean accept length, TPOT and TTFT)."""
    levels = []
    for lv in recorded_levels(run):
        if not lv.get("completed") or not (lv.get("tpot_ms") or {}).get("mean"):
            continue
        completed, ttft_s = int(lv["completed"]), float(lv["ttft_ms"]["mean"]) / 1000
        per_request = float(lv["total_output_tokens"]) / completed
        held_s = float(lv["duration_s"]) * min(int(lv["concurrency"]), completed) / completed
        levels.append(Level(
            concurrency=int(lv["concurrency"]),
            accept_len=float(lv.get("accept_len") or 1.0),
            tpot_s=float(lv["tpot_ms"]["mean"]) / 1000,
            ttft_s=ttft_s,
            output_throughput=float(lv["output_throughput"]),
            token_s=max(held_s - ttft_s, 0.0) / max(per_request - 1, 1.0)))
    if not levels:
        raise ProfileError(f"recording {run}: bench.json has no completed level")
    return Profile(run=run, levels=levels, algorithm=algorithm, size=size)


def _exists(run: str) -> bool:
    if (RECORDINGS / run / "bench.json").is_file():
        return True
    return SHIPPED.is_file() and run in json.loads(SHIPPED.read_text())


def chosen_set(name: str = "") -> str:
    """The set named, else the trained pair's where its runs are here, else the random one."""
    if name:
        if name not in SETS:
            raise ProfileError(f"TEST_ENGINE_RECORDING_SET={name}: one of {', '.join(SETS)}")
        return name
    trained = SETS[DEFAULT_SET]
    if all(_exists(run) for runs in trained.values() for run in runs.values()):
        return DEFAULT_SET
    return "random"


def pick(algorithm: str, size: int, set_name: str) -> tuple[str, int]:
    """The set's run for the algorithm whose budget or block is nearest `size`."""
    runs = SETS[set_name].get(algorithm) or SETS[set_name]["DFLASH"]
    best = min(runs, key=lambda s: (abs(s - size), -s))
    return runs[best], best


@dataclass
class Profiles:
    """What a launch plays: its own mode's run, and the baseline's for the plain step."""

    mode: Profile
    plain: Profile
    set_name: str

    def says(self) -> str:
        """One line for the log: which recordings its figures come from."""
        lv = ", ".join(f"c={v.concurrency} accept length {v.accept_len:.2f}, "
                       f"{v.output_throughput:.0f} tok/s" for v in self.mode.levels)
        text = (f"acceptance and step times replay the real engine's recording {self.mode.run} "
                f"({lv})" if self.mode.algorithm != "NONE" else
                f"step times replay the real engine's recording {self.mode.run} ({lv})")
        if self.mode is not self.plain:
            text += f"; a plain step is {self.plain.run}'s"
        overridden = [f"{name}={value:g}" for name, value in
                      (("TEST_ENGINE_ACCEPT_LEN", ACCEPT_LEN), ("TEST_ENGINE_TOKEN_S", TOKEN_S))
                      if value > 0]
        if overridden:
            text += f" (overridden by the test's {', '.join(overridden)})"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"recording": self.mode.run, "plain_recording": self.plain.run,
                "set": self.set_name, "levels": [lv.__dict__ for lv in self.mode.levels]}


def profiles_for(algorithm: str, size: int, *, recording: str = "",
                 set_name: str = "") -> Profiles:
    name = chosen_set(set_name)
    base_run, _ = pick("NONE", 0, name)
    plain = load_profile(base_run, algorithm="NONE")
    if algorithm == "NONE" and not recording:
        return Profiles(mode=plain, plain=plain, set_name=name)
    run, recorded_size = (recording, size) if recording else pick(algorithm, size, name)
    return Profiles(mode=load_profile(run, algorithm=algorithm, size=recorded_size),
                    plain=plain, set_name=name)


class Acceptance:
    """Accepted tokens per step with a recorded mean, played exactly: a running sum."""

    def __init__(self) -> None:
        self.total = 0.0

    def take(self, mean: float, block: int) -> int:
        before = math.floor(self.total)
        self.total += max(mean, 1.0)
        return max(1, min(block, math.floor(self.total) - before))


# accept-collapse falls to a drafter's acceptance on a target it was not trained for: the
# trained pair's wrong-drafter run where it is here, else the random-weight DFLASH run.
COLLAPSE_RUNS = ("433c58ed7/trained_wrong", "433c58ed7/dflash_triton")


def launch_profiles(algorithm: str, size: int, *, recording: str = "", set_name: str = "",
                    collapse_recording: str = "") -> tuple[Profiles, Profile | None]:
    """What a launch plays (launch_server.main): its mode's profiles, and accept-collapse's."""
    profiles = profiles_for(algorithm, size, recording=recording, set_name=set_name)
    collapsed = None
    if algorithm != "NONE":
        run = collapse_recording or next((r for r in COLLAPSE_RUNS if _exists(r)), "")
        collapsed = load_profile(run, algorithm="DFLASH") if run else None
    return profiles, collapsed


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["write"]:
        raise SystemExit("usage: python3 -m sglang.test_engine.profile write")
    print(f"{SHIPPED}: {', '.join(write_shipped())}")
