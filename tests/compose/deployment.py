"""The compose deployment, driven from a test: up, wait until healthy, kill, restart, down.

Each test run is its own compose project (`-p aip-hermes-test-<random>`) with the NATS, gateway,
Hermes and fake Hermes ports published on free loopback ports, so it never collides with a
deployment a developer runs, and `down` removes exactly what it created (containers, network,
volumes). The `dev` profile is on (the fake LLM of the real Hermes, and the fake Hermes), and
the workers serve endpoint hermes-1 with the fake Hermes, whose faults the test injects.
`docker compose` (v2) is used when the client has it, else `docker-compose` 1.29.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from worker.testing.services import free_ports

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
COMPOSE_FILE = COMPOSE / "docker-compose.yml"
#: Lines of output a failed compose or docker command shows (a failed build's log tail).
LOG_TAIL_LINES = 60
#: Starts tried, each on fresh host ports, when a published port was taken meanwhile.
PORT_ATTEMPTS = 3


def compose_command() -> list[str] | None:
    """`docker compose` when the client has the plugin, else `docker-compose`, else None."""
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, timeout=20
        )
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


class DeploymentError(AssertionError):
    """A compose or docker command failed; the message ends with its output's tail."""


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _port_in_use(output: str) -> bool:
    """Whether compose failed because a host port it publishes was taken (the engine's words
    differ between the userland proxy and iptables-only publishing)."""
    return "address already in use" in output or "port is already allocated" in output


@dataclass
class Deployment:
    """One compose project of the deployment, with the `dev` profile (the fakes)."""

    compose: list[str]
    nats_port: int
    gateway_port: int
    hermes_port: int
    fake_hermes_port: int
    project: str = field(default_factory=lambda: f"aip-hermes-test-{secrets.token_hex(4)}")

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def mcp_url(self) -> str:
        """The gateway's MCP endpoint, published on loopback."""
        return f"http://127.0.0.1:{self.gateway_port}/mcp"

    @property
    def hermes_url(self) -> str:
        """The real Hermes (the `hermes` service)."""
        return f"http://127.0.0.1:{self.hermes_port}"

    @property
    def fake_hermes_url(self) -> str:
        return f"http://127.0.0.1:{self.fake_hermes_port}"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "AIP_NATS_PORT": str(self.nats_port),
            "AIP_GATEWAY_PORT": str(self.gateway_port),
            "AIP_HERMES_PORT": str(self.hermes_port),
            "AIP_FAKE_HERMES_PORT": str(self.fake_hermes_port),
            # The workers' hermes-1 is the fake Hermes: only it can be told to be slow.
            "AIP_HERMES_1_URL": "http://fake-hermes:8642",
        }

    def run(self, *args: str, timeout_s: float = 180.0, check: bool = True) -> str:
        """One compose command on this project; its output, or DeploymentError with the tail."""
        command = [*self.compose, "-p", self.project, "-f", str(COMPOSE_FILE), "--profile", "dev"]
        done = subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=timeout_s, env=self._env()
        )
        if check and done.returncode != 0:
            raise DeploymentError(
                f"`compose {' '.join(args)}` exited {done.returncode}; output tail:\n"
                + _tail(done.stdout + done.stderr)
            )
        return done.stdout

    def docker(self, *args: str, timeout_s: float = 60.0) -> str:
        done = subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=timeout_s, env=self._env()
        )
        if done.returncode != 0:
            raise DeploymentError(
                f"`docker {' '.join(args)}` exited {done.returncode}:\n" + _tail(done.stderr)
            )
        return done.stdout

    def up(self) -> float:
        """Build the images (a failure shows the build log's tail) and start it all; the
        seconds the build took (the Hermes image's pip install dominates a cold one).

        The host ports were free when chosen, but the Hermes container publishes its port
        only once the gateway is healthy, tens of seconds later, and a parallel test may bind
        one of them meanwhile. A start refused for a port in use is taken down and tried again
        on fresh ports, at most `PORT_ATTEMPTS` times; any other failure is raised at once.
        """
        started = time.monotonic()
        self.run("build", timeout_s=900)
        built = time.monotonic() - started
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                self.run("up", "-d", timeout_s=300)
                return built
            except DeploymentError as refused:
                if not _port_in_use(str(refused)):
                    raise
                self.down()
                self.nats_port, self.gateway_port, self.hermes_port, self.fake_hermes_port = (
                    free_ports(4)
                )
        self.run("up", "-d", timeout_s=300)
        return built

    def logs(self, service: str, lines: int = 40) -> str:
        """The tail of a service's logs, for a failure message."""
        return _tail(self.run("logs", "--no-color", "--tail", str(lines), service, check=False))

    def containers(self, service: str) -> list[str]:
        """Full ids of the service's containers (running or not)."""
        return self.run("ps", "-q", service).split()

    def inspect(self, container: str) -> dict[str, object]:
        found: list[dict[str, object]] = json.loads(self.docker("inspect", container))
        return found[0]

    def wait_healthy(self, service: str, count: int, timeout_s: float = 180.0) -> list[str]:
        """Wait until `count` containers of `service` report healthy; their ids."""
        deadline = time.monotonic() + timeout_s
        while True:
            healthy = [c for c in self.containers(service) if self._health(c) == "healthy"]
            if len(healthy) >= count:
                return healthy
            if time.monotonic() >= deadline:
                raise DeploymentError(
                    f"{len(healthy)}/{count} {service} containers healthy after {timeout_s:.0f}s;"
                    f" logs tail:\n{_tail(self.run('logs', '--tail', '30', check=False))}"
                )
            time.sleep(1.0)

    def _health(self, container: str) -> str:
        state = self.inspect(container)["State"]
        assert isinstance(state, dict)
        health = state.get("Health") or {}
        return str(health.get("Status", state.get("Status")))

    def hostname(self, container: str) -> str:
        config = self.inspect(container)["Config"]
        assert isinstance(config, dict)
        return str(config["Hostname"])

    def redis_cli(self, *args: str) -> str:
        """A redis-cli command in the Redis container as the operators' `admin` ACL user."""
        (redis,) = self.containers("redis")
        password = (COMPOSE / "secrets" / "redis_admin_password").read_text().strip()
        return self.docker(
            "exec", redis, "redis-cli", "--user", "admin", "--pass", password,
            "--no-auth-warning", *args,
        ).strip()  # fmt: skip

    def down(self) -> None:
        """Remove the project's containers, network and volumes (images stay cached)."""
        self.run("down", "-v", "--remove-orphans", "--timeout", "10", timeout_s=180, check=False)

    def leftovers(self) -> dict[str, list[str]]:
        """Whatever of this project still exists on the engine, by kind (empty when clean)."""
        label = f"label=com.docker.compose.project={self.project}"
        found = {
            "containers": self.docker("ps", "-aq", "--filter", label).split(),
            "networks": self.docker("network", "ls", "-q", "--filter", label).split(),
            "volumes": self.docker("volume", "ls", "-q", "--filter", label).split(),
        }
        return {kind: ids for kind, ids in found.items() if ids}
