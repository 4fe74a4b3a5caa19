"""Redis Cluster with replicas: losing a master that holds in-flight Actions' keys.

Workers run on the cluster client with replica confirmation on (`AIPD_REDIS_WAIT_REPLICAS=1`).
The test kills -9 the master owning the most in-flight bindings, lets its replica take over,
and restarts the old master (it rejoins as a replica, from its AOF). Counted as for every
node loss: no Action without a result, no second `POST /v1/runs`, no result twice.

Separately, what the confirmation guards against is shown on the store itself: with the
slot's replica frozen, a start claim is never reported written-and-safe (the caller gets
`StoreUnavailable`, and the operator sends nothing), while a later binding write goes
through and is counted as unconfirmed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from schemas.ids import new_action_id
from tests.cluster.cluster_stack import POST_RUNS, cluster_stack, run_with_node_loss
from worker.errors import StoreUnavailable
from worker.store.connection import WriteConfirmation, open_redis
from worker.store.keys import ActionKeys
from worker.store.lease_store import LeaseStore
from worker.store.operator_store import OperatorStore, WriteStatus
from worker.testing.redis_cluster import RedisCluster
from worker.testing.services import ServiceHandle

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.chaos,
    pytest.mark.redis_cluster(masters=3, replicas_per_master=1),
]

LEASE_TTL_MS = 6000


async def test_killing_a_master_with_in_flight_actions_loses_nothing(
    redis_cluster: RedisCluster, nats_server: ServiceHandle, tmp_path: Path
) -> None:
    async with cluster_stack(
        tmp_path,
        nats_urls=[nats_server.url],
        redis_url=redis_cluster.urls[0],
        redis_cluster=True,
        lease_ttl_ms=LEASE_TTL_MS,
        replicas=1,
        extra_env={
            "AIPD_HERMES_MAX_CONCURRENT_RUNS": "25",
            "AIPD_REDIS_WAIT_REPLICAS": "1",
        },
    ) as stack:
        for n in range(3):
            await stack.spawn(f"w{n}")

        async def kill_busiest_master(batch: list) -> dict[str, float]:  # type: ignore[type-arg]
            started = set(stack.fake.stats().session_starts)
            in_flight = [a.id for a in batch if f"aip-operator-{a.id}" in started]
            owners = Counter(
                redis_cluster.node_for_key(ActionKeys.of(a).binding).port for a in in_flight
            )
            port, count = owners.most_common(1)[0]
            [master] = [node for node in redis_cluster.nodes if node.port == port]
            [replica] = redis_cluster.replicas_of(master)
            killed_at = time.monotonic()
            master.kill()
            await asyncio.to_thread(redis_cluster.wait_promoted, replica, 30.0)
            promoted = time.monotonic() - killed_at
            await asyncio.to_thread(master.restart)
            await asyncio.to_thread(redis_cluster.wait_ok, 30.0)
            return {
                "in_flight_on_killed_master": float(count),
                "replica_promoted_after": promoted,
                "old_master_back_as_replica_after": time.monotonic() - killed_at,
            }

        report = await run_with_node_loss(
            stack, actions=50, disrupt=kill_busiest_master, in_flight_before_disruption=15
        )
        print(f"\nRedis master loss: {report.line()}")
        # The stores ride out the failover (CLUSTERDOWN, closed connections) by retrying;
        # no delivery had to be given up and redelivered because of it.
        for worker in stack.workers:
            assert "delivery failed unexpectedly" not in worker.log_text(), worker.log_tail()
        assert report.notes["in_flight_on_killed_master"] >= 1
        assert report.lost == 0, report.line()
        assert report.duplicate_starts == 0, report.line()
        assert report.results_published_twice == 0, report.line()
        assert stack.fake.stats().count(POST_RUNS) <= 50
        # Every run either completed or was settled honestly: never a silent second start.
        assert set(report.statuses) <= {"completed", "failed:operator_outcome_unknown"}, (
            report.line()
        )


async def test_a_start_claim_no_replica_confirms_is_refused(redis_cluster: RedisCluster) -> None:
    client = open_redis(redis_cluster.urls[0], cluster=True, confirm=WriteConfirmation(1, 100))
    try:
        leases = LeaseStore(client)
        operator = OperatorStore(client, call_budget_s=1.0)
        keys = ActionKeys.of(new_action_id())
        grant = await leases.acquire(keys, "w1#a", 30_000, "fp")
        created = await operator.create(keys, "w1#a", grant.fence, b'{"s":0}', "starting")
        assert created.status is WriteStatus.CREATED
        assert operator.unconfirmed_writes == 0

        [replica] = redis_cluster.replicas_of(redis_cluster.node_for_key(keys.binding))
        replica.pause()
        try:
            with pytest.raises(StoreUnavailable, match="not confirmed"):
                await operator.write(keys, "w1#a", grant.fence, 1, b'{"claim":1}', "starting")
            refused = operator.unconfirmed_writes
            assert refused >= 2  # re-sent with its confirmation until the budget ran out
            # The claim is on the master, unconfirmed; a write past `starting` is not held
            # back (the run would exist already) but is counted.
            bound = await operator.write(keys, "w1#a", grant.fence, 2, b'{"run":1}', "running")
            assert bound.status is WriteStatus.WRITTEN
            assert operator.unconfirmed_writes == refused + 1
        finally:
            replica.resume()
        ended = await operator.write(keys, "w1#a", grant.fence, 3, b'{"done":1}', "completed")
        assert ended.status is WriteStatus.WRITTEN
        assert operator.unconfirmed_writes == refused + 1
    finally:
        await client.aclose()


async def test_a_start_claim_confirmed_on_a_resend_answers_created(
    redis_cluster: RedisCluster,
) -> None:
    """The first run of the create is not confirmed (its replica is paused), the re-send
    meets that run's own binding: the store still answers `created`, not `exists`."""
    client = open_redis(redis_cluster.urls[0], cluster=True, confirm=WriteConfirmation(1, 100))
    try:
        leases = LeaseStore(client)
        operator = OperatorStore(client, call_budget_s=10.0)
        keys = ActionKeys.of(new_action_id())
        grant = await leases.acquire(keys, "w1#a", 30_000, "fp")
        [replica] = redis_cluster.replicas_of(redis_cluster.node_for_key(keys.binding))
        replica.pause()
        try:
            claim = asyncio.create_task(
                operator.create(keys, "w1#a", grant.fence, b'{"s":0}', "starting")
            )
            for _ in range(100):  # bounded: 10 s
                if operator.unconfirmed_writes >= 1:
                    break
                await asyncio.sleep(0.1)
            assert operator.unconfirmed_writes >= 1
        finally:
            replica.resume()
        created = await asyncio.wait_for(claim, 15)
        assert created.status is WriteStatus.CREATED
        assert created.stored.doc == b'{"s":0}'
        assert created.stored.revision == 1
    finally:
        await client.aclose()


async def test_pipelined_renewal_survives_a_failover_that_empties_the_script_cache(
    redis_cluster: RedisCluster,
) -> None:
    client = open_redis(redis_cluster.urls[0], cluster=True)
    try:
        leases = LeaseStore(client)
        held = []
        for n, node in enumerate(redis_cluster.masters()):
            while True:
                keys = ActionKeys.of(new_action_id())
                if redis_cluster.node_for_key(keys.lease) is node:
                    break
            grant = await leases.acquire(keys, f"w1#{n}", 30_000, "fp")
            held.append((keys, f"w1#{n}", grant.fence))
        assert all(r.still_held for r in await leases.renew_many(held, 30_000, budget_s=5))

        master = redis_cluster.node_for_key(held[0][0].lease)
        [replica] = redis_cluster.replicas_of(master)
        await asyncio.to_thread(redis_cluster.failover, replica)
        sha = leases.scripts["lease_renew"].sha
        admin = replica.client()
        try:
            # The promoted node never loaded the script: the renewal must reload it.
            assert admin.script_exists(sha) == [False]
        finally:
            admin.close()

        renewals = await leases.renew_many(held, 30_000, budget_s=10)
        assert [r.still_held for r in renewals] == [True, True, True]
    finally:
        await client.aclose()
