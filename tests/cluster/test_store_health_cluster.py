"""The store gate on Redis Cluster: INFO answers per node, and the fullest master decides."""

from __future__ import annotations

import pytest

from worker.store.connection import open_redis
from worker.store.health import StoreHealth
from worker.testing.redis_cluster import RedisCluster

MIB = 1024 * 1024


@pytest.mark.chaos
async def test_one_full_master_closes_the_gate(redis_cluster: RedisCluster) -> None:
    client = open_redis(redis_cluster.urls[0], cluster=True)
    health = StoreHealth(client, reserve_bytes=4 * MIB)
    full = redis_cluster.masters()[1].client()
    try:
        assert await health.check()
        used = int(full.info("memory")["used_memory"])
        # 100 KiB free: less than the reserve (a quarter of this small maxmemory).
        full.config_set("maxmemory", str(used + 100 * 1024))
        checked = await health.check()
        assert not checked
        assert health.answering
        assert not health.has_room
        full.config_set("maxmemory", "0")
        assert await health.check()
    finally:
        full.config_set("maxmemory", "0")
        full.close()
        await client.aclose()
