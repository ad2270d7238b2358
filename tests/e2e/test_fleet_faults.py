"""The fleet under faults, on the one-command GPU-less trial (compose.yaml +
docker/compose.trial.yaml), as a user meets them, with a client calling the gateway in a
loop the whole time (varied prompts, each request timed):

- one engine paused (`docker pause` of its container on its host): no request waits past
  the gateway's first-byte timeout (APPLIANCE_GATEWAY_FIRST_BYTE_TIMEOUT_S, set short here),
  a request the paused engine did not answer is answered by the other replica;
- a host paused (a partition): the same bound; once the host is silent its rows read
  `unknown` in the API (detail, list, replicas) and on the deployment page left open,
  without a reload, never `ready`;
- the host stopped and started (its Docker restarts, its engines exit): its replica and the
  companion come back `ready` by themselves, no click, within a bound, and the open page
  shows it.

One test, the whole story (a trial's start costs minutes): run under the Docker lock.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest
import requests
from playwright.sync_api import Page, expect

from tests.e2e.test_fleet_trial import (
    ADMIN_PASSWORD,
    Api,
    Trial,
    _fleet_state,
    _login,
    _spec,
    _wait_replicas_ready,
)
from tests.e2e.test_fleet_trial import trial as _trial_fixture  # noqa: F401 - its teardown

FIRST_BYTE_S = 6  # APPLIANCE_GATEWAY_FIRST_BYTE_TIMEOUT_S here (the default is 120)
SILENT_S = 10  # APPLIANCE_AGENT_SILENT_S (the trial's)
HEAL_BOUND_S = 180  # a restarted host: its dockerd, its agent, the backoff, an engine start
# A request's longest wait: the first-byte timeout on the engine that does not answer, then
# its retry on the other replica (a few seconds on a loaded 2-core machine).
WAIT_BOUND_S = FIRST_BYTE_S + 10


@pytest.fixture
def trial(_trial_fixture: Trial) -> Iterator[Trial]:  # noqa: F811 - the trial, bounded waits short
    with _trial_fixture.env_file.open("a") as env:
        env.write(f"APPLIANCE_GATEWAY_FIRST_BYTE_TIMEOUT_S={FIRST_BYTE_S}\n"
                  f"APPLIANCE_GATEWAY_IDLE_STREAM_TIMEOUT_S={FIRST_BYTE_S}\n")
    yield _trial_fixture


class Loop:
    """One client calling the gateway in a loop with varied prompts, each request timed."""

    def __init__(self, url: str, key: str, model: str) -> None:
        self.url, self.model = f"{url}/v1/chat/completions", model
        self.headers = {"Authorization": f"Bearer {key}"}
        self.times: list[float] = []
        self.failed: list[str] = []
        self.retried = 0  # answers a second replica gave (X-Appliance-Retried)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            body = {"model": self.model, "max_tokens": 8,
                    "messages": [{"role": "user", "content": f"request {n}: count to {n % 17}"}]}
            started = time.monotonic()
            try:
                # The client's own limit is far past the bound: a wait past it is seen.
                answer = requests.post(self.url, json=body, headers=self.headers, timeout=120)
                if answer.status_code != 200 or not answer.json()["choices"][0]["message"]:
                    self.failed.append(f"#{n} {answer.status_code} {answer.text[:300]}")
                self.retried += answer.headers.get("x-appliance-retried") == "1"
            except (requests.RequestException, ValueError, KeyError) as exc:
                self.failed.append(f"#{n} {exc!r}")
            self.times.append(time.monotonic() - started)

    def __enter__(self) -> Loop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(150)

    def longest(self) -> float:
        return max(self.times, default=0.0)


def _engines(trial: Trial, host: str) -> list[str]:
    code, out = trial.container(host).exec_run(
        ["docker", "ps", "--filter", "label=appliance.managed=1", "--format", "{{.Names}}"])
    assert code == 0, out
    return [line for line in out.decode().splitlines() if line]


def _frozen(pause: Any, what: str) -> None:
    """Freeze with `pause`, tried again while the kernel's freezer gives up.

    runc's freeze fails ("unable to freeze") when a task does not stop within its retries,
    seen on a loaded machine with a busy nested Docker (CI 2026-12-07); a frozen host is
    the fault under test, so it is asked for again, a bounded number of times."""
    for attempt in range(6):
        try:
            pause()
            return
        except docker.errors.APIError as exc:
            if "unable to freeze" not in str(exc) or attempt == 5:
                raise
            time.sleep(1)
    raise AssertionError(f"{what} not frozen")


def _pause_engine(trial: Trial, host: str, engine: str) -> None:
    def pause() -> None:
        code, out = trial.container(host).exec_run(["docker", "pause", engine])
        if code != 0:
            raise docker.errors.APIError(out.decode(errors="replace"))
    _frozen(pause, f"{engine} on {host}")


def _until(what: str, check: Any, timeout_s: float) -> float:
    started = time.monotonic()
    while (found := check()) is not True:
        assert time.monotonic() - started < timeout_s, f"{what}: {found}"
        time.sleep(1)
    return time.monotonic() - started


def test_a_paused_engine_a_lost_host_and_a_restarted_host_under_a_client_loop(
        trial: Trial, page: Page) -> None:
    trial.compose("up", "-d", "--build", timeout=1500)
    trial.wait_healthy()
    password = re.findall(ADMIN_PASSWORD, trial.compose("logs", "web"))[0]
    page.set_default_navigation_timeout(90_000)
    _login(page, trial.url, password)
    _until("both hosts ready", lambda: all(
        _fleet_state(page, trial.url, h) == "ready" for h in ("sim-a", "sim-b")) or "not yet",
        180)
    token = re.findall(r"(sda_[0-9a-f]{64})",
                                     trial.manage("apitoken", "create", "admin"))[0]
    key = trial.compose("exec", "-T", "web", "python3", "manage.py", "apikey", "create",
                        "admin", "faults").split("\n")[0].strip()
    api = Api(trial.url, token)

    # Two replicas, one a host, and a companion the spec names, on sim-b.
    base_spec = _spec("faults-base", gpus=[2])
    base_spec["host"] = "sim-b"
    base = api.post("/deployments/", {"spec": base_spec, "confirm_warnings": True})["id"]
    fleet = api.post("/deployments/", {
        "spec": _spec("faults", gpus=[0], replicas=2, companion="faults-base"),
        "confirm_warnings": True})["id"]
    rows = _wait_replicas_ready(api, fleet, 2)
    _wait_replicas_ready(api, base, 1)
    assert {r["host"] for r in rows} == {"sim-a", "sim-b"}, rows
    on_b = next(r for r in rows if r["host"] == "sim-b")
    page.goto(f"{trial.url}/deployments/{fleet}/")  # left open from here on, never reloaded
    expect(page.locator("#replica-rows tbody tr")).to_have_count(2)
    status_b = page.locator(f'#replica-rows tr[data-replica="{on_b["index"]}"] .status')
    expect(status_b).to_have_text("ready")

    with Loop(trial.url, key, "faults") as loop:
        time.sleep(3)
        # 1. One engine paused on sim-a: its requests are answered by sim-b's in time.
        engine = _engines(trial, "sim-a")
        assert len(engine) == 1, engine
        _pause_engine(trial, "sim-a", engine[0])
        time.sleep(FIRST_BYTE_S * 3)
        code, out = trial.container("sim-a").exec_run(["docker", "unpause", engine[0]])
        assert code == 0, out
        paused_engine = loop.longest()

        # 2. sim-b paused: the same bound; once silent, its rows read unknown in the API and
        #    on the open page, without a reload.
        _frozen(trial.container("sim-b").pause, "sim-b")
        try:
            def unknown() -> Any:
                replicas = {r["index"]: r["status"] for r in
                            api.get(f"/deployments/{fleet}/replicas/")["results"]}
                listed = {d["id"]: d["status"] for d in api.get("/deployments/")["results"]}
                shown = (api.get(f"/deployments/{on_b['id']}/")["status"],
                         api.get(f"/deployments/{base}/")["status"],
                         listed.get(on_b["id"]), listed.get(base),
                         replicas[on_b["index"]])
                return shown == ("unknown",) * 5 or shown
            lost_after = _until("sim-b's rows unknown in the API", unknown, SILENT_S + 40)
            expect(status_b).to_have_text("unknown", timeout=15_000)
            other = page.locator(f'#replica-rows tr[data-replica="{1 - on_b["index"]}"] .status')
            expect(other).to_have_text("ready")
            time.sleep(2)
        finally:
            trial.container("sim-b").unpause()
        expect(status_b).to_have_text("ready", timeout=40_000)
        paused_host = loop.longest()

        # 3. sim-b stopped and started: its replica and the companion come back by
        #    themselves, a new run each; every request meanwhile is answered (a request
        #    sim-b's replica fails is retried on sim-a's, whatever the rotation said).
        trial.container("sim-b").stop(timeout=10)
        stopped = time.monotonic()
        trial.container("sim-b").start()
        _until("sim-b's replica and the companion ready again", lambda: (
            api.get(f"/deployments/{on_b['id']}/")["status"] == "ready"
            and api.get(f"/deployments/{on_b['id']}/")["run"] > on_b["run"]
            and api.get(f"/deployments/{base}/")["status"] == "ready"
            and api.get(f"/deployments/{base}/")["run"] > 1) or "not yet", HEAL_BOUND_S)
        healed_after = time.monotonic() - stopped
        expect(status_b).to_have_text("ready", timeout=15_000)
        time.sleep(3)
    assert loop.failed == [], loop.failed[:5]
    assert len(loop.times) > 20 and loop.longest() <= WAIT_BOUND_S, (
        f"a request waited {loop.longest():.1f} s; the bound is {WAIT_BOUND_S} s "
        f"(first byte {FIRST_BYTE_S} s and a retry)")
    died = [r for r in api.get(f"/deployments/{base}/runs/")["results"] if r["number"] == 1]
    assert died and "signal 127" not in str(died[0]["diagnosis"]), died
    print(f"faults: {len(loop.times)} requests, 0 failed, {loop.retried} retried; longest wait "
          f"{paused_engine:.1f} s with an engine paused, {paused_host:.1f} s with a host "
          f"paused (first byte {FIRST_BYTE_S} s); rows unknown {lost_after:.1f} s after the "
          f"pause; replica and companion ready {healed_after:.1f} s after `docker stop`; "
          f"run 1's end: {died[0]['diagnosis']}")
