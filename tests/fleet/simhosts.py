"""Simulated GPU hosts for the fleet's end-to-end tests: containers of docker/sim-host, each
with its own Docker engine and the host's agent, each on its own network; and the faults a
fleet meets (a host's agent killed, a host paused: a partition, a host removed).

    with sim_hosts(client, image, {"sim-a": token_a}, panel_port=port) as hosts:
        hosts["sim-a"].pause()

The panel is either a process on this machine (tests.servers.panel_server bound to
0.0.0.0: a host reaches it at its network's gateway) or a compose stack's web container
(connected to each host's network, reached as http://web:8000). A join token goes into the
host's file system before it starts (APPLIANCE_JOIN_TOKEN_FILE), never into its
environment or a log. Every container and network carries the session's test label, so
teardown (and docker_client's) removes this session's alone. Run under the Docker lock.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import subprocess
import tarfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import docker.errors
from docker.client import DockerClient
from docker.models.containers import Container
from docker.models.networks import Network

from tests.conftest_docker import REPO, TEST_LABELS, TEST_SESSION, ensure_base_image

SIM_HOST_IMAGE = f"appliance-sim-host:test-{TEST_SESSION[:6]}"
PANEL_IMAGE = "sd-appliance:sim-host-test"
TOKEN_PATH = "/run/join/token"
# What a sim host's own dockerd needs: --privileged less CAP_SYS_RESOURCE, which this
# machine's Docker cannot give (docker/sim-host/Dockerfile says why).
NESTED_DOCKER: dict[str, object] = {
    "cap_add": ["ALL"], "cap_drop": ["SYS_RESOURCE"],
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
    "volumes": {"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
}


def sim_host_image(client: DockerClient, *, panel_image: str = PANEL_IMAGE) -> str:
    """The panel image from this checkout, then the sim host on it (layer cache keeps a
    second build to seconds)."""
    ensure_base_image(client)
    ca = REPO / "docker" / "panel" / "ca" / "ca.pem"
    system_ca = Path("/etc/ssl/certs/ca-certificates.crt")
    # A TLS-intercepting proxy's CA for the panel image's pip step, as tests/setup-and-run.sh.
    if not ca.exists() and system_ca.is_file() and system_ca.stat().st_size:
        ca.write_bytes(system_ca.read_bytes())
    for argv in (
        ["docker", "build", "-q", "-t", panel_image, "-f", "docker/panel/Dockerfile",
         "--build-arg", "PYTHON_IMAGE=appliance-python:bookworm", "."],
        ["docker", "build", "-q", "-t", SIM_HOST_IMAGE, "-f", "docker/sim-host/Dockerfile",
         "--build-arg", f"PANEL_IMAGE={panel_image}", "."],
    ):
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:6])} failed: {done.stdout[-1500:]}"
                               f"{done.stderr[-1500:]}")
    return SIM_HOST_IMAGE


@dataclass
class SimHost:
    """One simulated host: its container and its own network."""

    name: str
    container: Container
    network: Network

    def run(self, *argv: str) -> str:
        """A command inside the host (its own `docker`, ps, kill); its output. Fails the
        test on a non-zero exit."""
        code, out = self.container.exec_run(list(argv))
        text = out.decode(errors="replace")
        assert code == 0, f"{self.name}: {' '.join(argv)} exited {code}: {text[-1000:]}"
        return text

    def address(self) -> str:
        self.container.reload()
        return str(self.container.attrs["NetworkSettings"]["Networks"][self.network.name]
                   ["IPAddress"])

    def agent_pid(self) -> int:
        """The agent's pid, waiting (bounded) while its entrypoint has not yet written it."""
        deadline = time.monotonic() + 10
        while not (text := self.run("cat", "/run/sim-host/agent.pid").strip()):
            assert time.monotonic() < deadline, f"{self.name}: no agent pid written in 10 s"
            time.sleep(0.2)
        return int(text)

    def kill_agent(self) -> int:
        """SIGKILL the host's agent (its entrypoint starts it again 2 s later, as compose's
        restart policy would); the pid killed."""
        pid = self.agent_pid()
        self.run("kill", "-KILL", str(pid))
        return pid

    def engines(self) -> list[str]:
        """The names of the engine containers running on this host's own Docker."""
        out = self.run("docker", "ps", "--filter", "label=appliance.managed=1",
                       "--format", "{{.Names}}")
        return [line for line in out.splitlines() if line]

    def pause(self) -> None:
        """A partition: every process of the host stops, its engines with it."""
        self.container.pause()

    def unpause(self) -> None:
        self.container.unpause()

    def remove(self) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self.container.remove(force=True, v=True)


def _put_token(container: Container, token: str) -> None:
    data = token.encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(TOKEN_PATH.rsplit("/", 1)[-1])
        info.size, info.mode = len(data), 0o600
        tar.addfile(info, io.BytesIO(data))
    container.put_archive(TOKEN_PATH.rsplit("/", 1)[0], buffer.getvalue())


def _wait_started(host: SimHost, timeout_s: float = 120) -> None:
    """Its dockerd up, the engine image imported, its agent started."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        host.container.reload()
        if host.container.status == "exited":
            raise AssertionError(f"{host.name} exited:\n{host.container.logs().decode()[-3000:]}")
        code, _ = host.container.exec_run(["test", "-s", "/run/sim-host/agent.pid"])
        if code == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"{host.name} did not start its agent in {timeout_s}s:\n"
                         f"{host.container.logs().decode()[-3000:]}")


def host_networks(client: DockerClient, names: list[str]) -> dict[str, Network]:
    """A network of its own for each host (made before the panel, whose allowed hosts name
    their gateways)."""
    return {name: client.networks.create(f"simhost-{TEST_SESSION[:6]}-{name}",
                                         driver="bridge", labels=dict(TEST_LABELS))
            for name in names}


def gateway(network: Network) -> str:
    """This machine's address on a Docker network. Docker leaves `Gateway` out of a
    bridge's IPAM when it found the bridge already made (a dockerd restarted on a machine
    whose docker0 stayed): the subnet's first address is the bridge's then."""
    network.reload()
    config = network.attrs["IPAM"]["Config"][0]
    return str(config.get("Gateway") or ipaddress.ip_network(config["Subnet"])[1])


@contextlib.contextmanager
def sim_hosts(client: DockerClient, image: str, tokens: Mapping[str, str], *,
              networks: Mapping[str, Network], panel_port: int | None = None,
              panel_container: Container | None = None,
              env: Mapping[str, str] | None = None) -> Iterator[dict[str, SimHost]]:
    """Start a host per token (its name: the token's host), each on its network, joined to
    the panel; yields them by name, then removes them, their volumes and their networks."""
    hosts: dict[str, SimHost] = {}
    try:
        for name, token in tokens.items():
            network = networks[name]
            if panel_container is not None:
                network.connect(panel_container, aliases=["web"])
                panel_url = "http://web:8000"
            else:
                panel_url = f"http://{gateway(network)}:{panel_port}"
            container = client.containers.create(
                image, name=f"simhost-{TEST_SESSION[:6]}-{name}", hostname=name,
                labels=dict(TEST_LABELS), network=network.name, detach=True,
                environment={"APPLIANCE_PANEL_URL": panel_url, "APPLIANCE_HOST_NAME": name,
                             "APPLIANCE_AGENT_ID": f"agent@{name}",
                             "APPLIANCE_JOIN_TOKEN_FILE": TOKEN_PATH,
                             "APPLIANCE_ENGINE_IMAGE": "appliance-test-engine:latest",
                             "APPLIANCE_ENGINE_GPU_REQUESTS": "false",
                             "APPLIANCE_GPU_COUNT": "4", **(env or {})},
                **NESTED_DOCKER)  # type: ignore[arg-type]
            _put_token(container, token)
            container.start()
            hosts[name] = SimHost(name=name, container=container, network=network)
        for host in hosts.values():
            _wait_started(host)
        yield hosts
    finally:
        for host in hosts.values():
            host.remove()
        for network in networks.values():
            with contextlib.suppress(docker.errors.APIError):
                if panel_container is not None:
                    network.disconnect(panel_container, force=True)
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                network.remove()
