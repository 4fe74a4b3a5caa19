"""A 3-node NATS JetStream cluster: replicated streams, and losing the stream leader.

`provision` with `stream_replicas=3` must create R3 streams (and R3 consumers, which inherit
the stream's replicas) and say where each stream lives. Workers get all three URLs; killing
the node that leads `AIP_HERMES_ACTIONS` under 50 in-flight operator Actions must cost no
Action, no second `POST /v1/runs` and no second result, only a stall, which is measured.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from subjects.grammar import Subjects
from tests.cluster.cluster_stack import cluster_stack, run_with_node_loss
from tests.integration.stack import ENDPOINT
from worker.testing.nats_cluster import NatsCluster
from worker.testing.nats_server import NatsServer, http_json
from worker.testing.services import ServiceHandle

pytestmark = [pytest.mark.cluster, pytest.mark.nats_cluster(size=3)]

STREAMS = [
    "AIP_HERMES_ACTIONS",
    "AIP_HERMES_DELEGATIONS",
    "AIP_HERMES_CHUNKS",
    "AIP_HERMES_RESULTS",
    "AIP_HERMES_DLQ",
    "AIP_HERMES_AUDIT",
]
LEASE_TTL_MS = 6000


def _provision_cli(urls: list[str]) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AIPD_NATS_URL": ",".join(urls),
        "AIPD_STREAM_REPLICAS": "3",
        "AIPD_HERMES_ENDPOINTS": f"{ENDPOINT}=http://127.0.0.1:9",
    }
    return subprocess.run(
        # The harness's server may predate the release check (its own test:
        # tests/integration/test_provision_store.py).
        [sys.executable, "-m", "worker", "provision", "--allow-nats-below-minimum"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_provision_creates_r3_streams_and_reports_their_placement(
    nats_cluster: NatsCluster,
) -> None:
    done = await asyncio.to_thread(_provision_cli, nats_cluster.urls)
    assert done.returncode == 0, done.stderr
    names = {node.server_name for node in nats_cluster.nodes}
    for stream in STREAMS:
        [line] = [line for line in done.stdout.splitlines() if f" {stream} " in line]
        assert " created " in line
        placed = re.search(r"leader (n\d); replicas (n\d) (n\d)\)", line)
        assert placed is not None, line
        assert set(placed.groups()) == names, line

    nc = await nats.connect(servers=nats_cluster.urls)
    try:
        js = nc.jetstream()
        for stream in STREAMS:
            info = await js.stream_info(stream)
            assert info.config.num_replicas == 3
            assert info.cluster is not None
            assert info.cluster.leader in names
            assert len(info.cluster.replicas or []) == 2
        subjects = Subjects()
        consumer = await js.consumer_info(
            subjects.stream_name("actions"), subjects.durable(ENDPOINT, "actions")
        )
        assert consumer.cluster is not None
        assert len(consumer.cluster.replicas or []) == 2
    finally:
        await nc.close()

    again = await asyncio.to_thread(_provision_cli, nats_cluster.urls)
    assert again.returncode == 0, again.stderr
    assert {line.split()[2] for line in again.stdout.splitlines()} == {"unchanged"}, again.stdout


@pytest.mark.chaos
async def test_killing_the_actions_stream_leader_loses_nothing(
    nats_cluster: NatsCluster, redis_server: ServiceHandle, tmp_path: Path
) -> None:
    async with cluster_stack(
        tmp_path,
        nats_urls=nats_cluster.urls,
        redis_url=redis_server.url,
        redis_cluster=False,
        lease_ttl_ms=LEASE_TTL_MS,
        replicas=3,
        extra_env={"AIPD_HERMES_MAX_CONCURRENT_RUNS": "25"},
    ) as stack:
        for n in range(3):
            await stack.spawn(f"w{n}")

        async def kill_leader(_: object) -> dict[str, float]:
            leader = await _leader_serving_a_worker(stack.nc, nats_cluster)
            workers_on_it = len(_worker_connections(leader))
            killed_at = time.monotonic()
            leader.kill()
            successor = await asyncio.to_thread(
                nats_cluster.stream_leader, "AIP_HERMES_ACTIONS", "$G", 30.0
            )
            elected = time.monotonic() - killed_at
            assert successor is not leader
            await asyncio.sleep(2.0)
            await asyncio.to_thread(leader.restart)
            await asyncio.to_thread(nats_cluster.wait_ready, 30.0)
            return {
                "workers_on_killed_node": float(workers_on_it),
                "new_leader_after": elected,
                "node_back_after": time.monotonic() - killed_at,
            }

        report = await run_with_node_loss(
            stack, actions=50, disrupt=kill_leader, in_flight_before_disruption=15
        )
        print(f"\nNATS stream-leader loss: {report.line()}")
        assert report.notes["workers_on_killed_node"] >= 1
        assert report.lost == 0, report.line()
        assert report.duplicate_starts == 0, report.line()
        assert report.results_published_twice == 0, report.line()
        assert report.statuses == {"completed": 50}, report.line()


def _worker_connections(node: NatsServer) -> list[dict[str, object]]:
    """The worker processes' client connections on `node` (its /connz report)."""
    connz = http_json(f"{node.monitor_url}/connz")
    return [c for c in connz.get("connections") or [] if c.get("name") == "aip-hermes-worker"]


async def _leader_serving_a_worker(nc: NATS, cluster: NatsCluster) -> NatsServer:
    """The actions stream's leader, moved (leader step-down) until at least one worker is
    connected to it, so the kill costs both the stream its leader and a worker its server.
    Workers pick a random URL from the list, so with three workers this takes a step or two.
    """
    for _ in range(6):
        leader = await asyncio.to_thread(cluster.stream_leader, "AIP_HERMES_ACTIONS")
        if _worker_connections(leader):
            return leader
        await nc.request("$JS.API.STREAM.LEADER.STEPDOWN.AIP_HERMES_ACTIONS", b"", timeout=5)
        await asyncio.sleep(0.5)
    raise AssertionError("no worker connected to any leader of AIP_HERMES_ACTIONS")
