"""A JetStream cluster of `nats-server` nodes on loopback, for leader-loss tests.

Leadership is read from each node's `/jsz` report, and a node counts as leader only when it
claims the role itself and every other reachable node agrees. Asking any single node is not
enough: right after a kill, followers still name the dead leader until they time it out.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from worker.testing._errors import ServiceStartError
from worker.testing._procs import ServiceGroup, free_ports, wait_until
from worker.testing.nats_server import NatsRoutes, NatsServer

_ATTEMPTS = 3


class NatsCluster(ServiceGroup):
    """`size` JetStream nodes named n1..nN with full-mesh routes, each with its own store.

    Reach a node with `node("n2")` or `nodes[1]` and kill, pause or restart it like a single
    `NatsServer`; its ports and store stay, so it rejoins with its data. `start()` returns once
    every node is up and all agree on a meta leader.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        binary: str | None = None,
        cluster_name: str = "aip-test",
        start_timeout: float = 30.0,
    ) -> None:
        if size < 2:
            raise ValueError("a cluster needs at least two nodes; use NatsServer for one")
        self.size = size
        self.binary = binary
        self.cluster_name = cluster_name
        self.start_timeout = start_timeout
        self.nodes: list[NatsServer] = []

    @property
    def urls(self) -> list[str]:
        """Client URLs of every node, for `nats.connect(servers=...)`."""
        return [node.url for node in self.nodes]

    def node(self, name: str) -> NatsServer:
        """The node with server name `name` (n1..nN)."""
        for node in self.nodes:
            if node.server_name == name:
                return node
        raise KeyError(name)

    def start(self) -> None:
        """Launch all nodes together (a lone node has no quorum) and wait for a meta leader.

        Ports are chosen as a set because every node's routes name them all; if one was taken
        before its node could bind it, the whole cluster is rebuilt on fresh ports.
        """
        for attempt in range(_ATTEMPTS):
            self._build()
            try:
                for node in self.nodes:
                    node.start(wait=False)
                self.wait_ready()
                return
            except ServiceStartError as exc:
                self.close()
                if not exc.port_clash or attempt + 1 == _ATTEMPTS:
                    raise

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until every running, unpaused node is ready and they agree on a meta leader."""
        limit = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        for node in self._reachable():
            node.wait_ready(timeout=max(deadline - time.monotonic(), 0.1))
        self.meta_leader(timeout=max(deadline - time.monotonic(), 0.1))

    def meta_leader(self, timeout: float = 10.0) -> NatsServer:
        """The node that leads the JetStream meta group, once all reachable nodes agree."""
        return self._agreed_leader(
            lambda node: node.meta_leader(), "the meta leader", timeout, every_node_knows=True
        )

    def stream_leader(self, stream: str, account: str = "$G", timeout: float = 10.0) -> NatsServer:
        """The node that leads `stream`'s raft group, once its reachable replicas agree."""
        return self._agreed_leader(
            lambda node: node.stream_leader(stream, account),
            f"a leader of stream {stream!r}",
            timeout,
            every_node_knows=False,
        )

    def _build(self) -> None:
        ports = free_ports(3 * self.size)
        route_ports = tuple(ports[2 * self.size :])
        self.nodes = [
            NatsServer(
                binary=self.binary,
                port=ports[2 * i],
                monitor_port=ports[2 * i + 1],
                server_name=f"n{i + 1}",
                routes=NatsRoutes(self.cluster_name, route_ports[i], route_ports),
                start_timeout=self.start_timeout,
            )
            for i in range(self.size)
        ]

    def _reachable(self) -> list[NatsServer]:
        return [node for node in self.nodes if node.running and not node.paused]

    def _agreed_leader(
        self,
        view: Callable[[NatsServer], str | None],
        what: str,
        timeout: float,
        *,
        every_node_knows: bool,
    ) -> NatsServer:
        found: list[NatsServer] = []

        def agreed() -> bool:
            views: dict[str, str | None] = {}
            for node in self._reachable():
                try:
                    views[node.server_name] = view(node)
                except OSError:
                    return False
            names = {name for name in views.values() if name is not None}
            if len(names) != 1 or (every_node_knows and None in views.values()):
                return False
            leader = names.pop()
            # Nodes without a replica of a stream report None; the leader must claim itself.
            if views.get(leader) != leader:
                return False
            found[:] = [self.node(leader)]
            return True

        wait_until(agreed, timeout=timeout, what=what, poll=0.1)
        return found[0]
