"""The Redis Cluster handle: slots spread keys over masters, and a replica replaces a master."""

from __future__ import annotations

import time

import pytest
from redis.crc import key_slot
from redis.exceptions import ClusterCrossSlotError, MovedError

from worker.testing.services import RedisCluster


def test_keys_with_different_hash_tags_live_on_different_masters(
    redis_cluster: RedisCluster,
) -> None:
    owners: dict[int, str] = {}
    for n in range(100):
        key = f"{{tag{n}}}:claim"
        owners.setdefault(redis_cluster.node_for_key(key).port, key)
        if len(owners) == 3:
            break
    assert len(owners) == 3
    assert sorted(owners) == sorted(node.port for node in redis_cluster.masters())

    cluster = redis_cluster.client()
    try:
        for key in owners.values():
            cluster.set(key, "held")
    finally:
        cluster.close()
    for port, key in owners.items():
        for node in redis_cluster.masters():
            client = node.client()
            try:
                if node.port == port:
                    assert client.get(key) == "held"
                else:
                    with pytest.raises(MovedError) as moved:
                        client.get(key)
                    assert moved.value.port == port
            finally:
                client.close()


def test_server_refuses_a_cross_slot_mset(redis_cluster: RedisCluster) -> None:
    first, second = "{a}:claim", "{b}:claim"
    assert key_slot(first.encode()) != key_slot(second.encode())
    client = redis_cluster.node_for_key(first).client()
    try:
        # redis-py maps the server's CROSSSLOT error code to this class.
        with pytest.raises(ClusterCrossSlotError):
            client.mset({first: "1", second: "2"})
    finally:
        client.close()


@pytest.mark.chaos
@pytest.mark.redis_cluster(masters=3, replicas_per_master=1)
def test_killed_master_is_replaced_by_its_replica_within_seconds(
    redis_cluster: RedisCluster,
) -> None:
    key = "{lease}:action-1"
    master = redis_cluster.node_for_key(key)
    (replica,) = redis_cluster.replicas_of(master)
    client = master.client()
    try:
        client.set(key, "worker-a")
        assert client.wait(1, 2000) == 1
    finally:
        client.close()

    master.kill()
    killed_at = time.monotonic()
    redis_cluster.wait_promoted(replica, timeout=15.0)

    assert time.monotonic() - killed_at < 15.0
    assert redis_cluster.node_for_key(key) is replica
    cluster = redis_cluster.client()
    try:
        assert cluster.get(key) == "worker-a"
    finally:
        cluster.close()

    master.restart()
    redis_cluster.wait_ok()
    assert redis_cluster.role(master) == "slave"
    assert redis_cluster.replicas_of(replica) == [master]


@pytest.mark.chaos
@pytest.mark.redis_cluster(masters=3, replicas_per_master=1)
def test_manual_failover_swaps_master_and_replica(redis_cluster: RedisCluster) -> None:
    master = redis_cluster.masters()[0]
    (replica,) = redis_cluster.replicas_of(master)

    redis_cluster.failover(replica)

    assert redis_cluster.role(replica) == "master"
    assert redis_cluster.role(master) == "slave"
    assert replica in redis_cluster.masters()


@pytest.mark.redis_cluster(use_cli=False)
def test_cluster_forms_without_a_cli(redis_cluster: RedisCluster) -> None:
    assert redis_cluster.cli is None
    slots = redis_cluster.slot_map()
    assert sum(last - first + 1 for first, last, _ in slots) == 16384
    assert len({port for *_, port in slots}) == 3
    cluster = redis_cluster.client()
    try:
        cluster.set("{x}:k", "1")
        assert cluster.get("{x}:k") == "1"
    finally:
        cluster.close()
